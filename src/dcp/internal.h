#pragma once

// Helpers shared by the dcp sources; not part of the public API.

#include <stowage/dcp/metadata.h>
#include <stowage/dcp/planner.h>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// Throws InvalidArgument naming `fqn` if `tensor` cannot be saved: undefined, or not a
// dense (strided, unquantized) tensor. Save plans it; async_save and the stagers check
// it before staging, so that every path gives the same error.
void check_saveable_tensor(const std::string& fqn, const at::Tensor& tensor);

inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Product of `sizes`; throws Error naming `what` on a negative size or an overflow.
int64_t checked_volume(const std::vector<int64_t>& sizes, const std::string& what);
// Bytes of a tensor of `sizes` and `dtype`: checked_volume times the element size, with
// the same errors (an overflow of the product too).
int64_t checked_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype, const std::string& what);

// Checks that `chunks` tile a tensor of `shape` exactly: every box has the tensor's
// rank, lies inside it, no two overlap, and together they cover it. Throws Error
// naming `what` otherwise.
void check_tiling(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks, const std::string& what);

// An ObjectPath as the metadata stores it: keys as strings, list indices as numbers.
nlohmann::json encode_path(const ObjectPath& path);

// A non-tensor leaf as the metadata stores it (docs/FORMAT.md), and back; decoding
// throws Error naming `origin` and `where` for malformed input.
nlohmann::json encode_value(const c10::IValue& value, const std::string& fqn);
c10::IValue decode_value(const nlohmann::json& value, const std::string& origin, const std::string& where);

// Plans and write results as bytes, to move between the ranks of one job (not a
// stored format: every rank runs the same build).
std::string encode_save_plan(const SavePlan& plan);
SavePlan decode_save_plan(const std::string& bytes);
std::string encode_write_results(const std::vector<WriteResult>& results);
std::vector<WriteResult> decode_write_results(const std::string& bytes);

// Rethrows the exception in flight (an Error) with `context` before its message, keeping
// its type and fields; a CorruptionError without an entry gets `entry`.
[[noreturn]] void rethrow_in_context(const std::string& context, const std::string& entry);

// An IoError of `operation` on `path` that says "<what>: <strerror(errno)>".
[[noreturn]] void throw_io_error(const std::string& what, const std::string& path, const std::string& operation,
                                 int error_number);

}  // namespace stowage::dcp::detail
