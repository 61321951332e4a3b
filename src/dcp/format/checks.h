#pragma once

// The checks of sizes and chunk boxes that every reader of stored shapes makes: stowage's
// metadata, the planner, PyTorch DCP's metadata, safetensors headers. Each check says
// what it found and leaves the error's type to the caller, who knows whose data it is: a
// CorruptionError for stored bytes (where it is found, with its entry and file), Error for
// the caller's own state.

#include <stowage/dcp/metadata.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// A count of elements or bytes, or why it cannot be made.
struct CheckedCount {
  int64_t value = 0;
  std::string problem;  // "<what>: negative size -3"; empty when `value` holds the count
  bool ok() const { return problem.empty(); }
};

// The product of `sizes`; a problem for a negative size or an overflow.
CheckedCount count_volume(const std::vector<int64_t>& sizes, const std::string& what);
// The bytes of a tensor of `sizes` and `dtype`: the volume times the element size, with
// the same problems (an overflow of the product too).
CheckedCount count_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype, const std::string& what);
// Why `chunks` do not tile a tensor of `shape` exactly (a box of another rank, one outside
// it, two that overlap, a gap), naming `what`; empty when they do.
std::string tiling_problem(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks,
                           const std::string& what);

// The same for the caller's own state (the planner's, or a reader's after the metadata's
// checks): an Error with the problem.
int64_t checked_volume(const std::vector<int64_t>& sizes, const std::string& what);
int64_t checked_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype, const std::string& what);
void check_tiling(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks, const std::string& what);

}  // namespace stowage::dcp::detail
