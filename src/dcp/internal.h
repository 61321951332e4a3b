#pragma once

// Helpers shared by the dcp sources; not part of the public API.

#include <stowage/dcp/metadata.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// Product of `sizes`; throws Error naming `what` on a negative size or an overflow.
int64_t checked_volume(const std::vector<int64_t>& sizes, const std::string& what);

// Checks that `chunks` tile a tensor of `shape` exactly: every box has the tensor's
// rank, lies inside it, no two overlap, and together they cover it. Throws Error
// naming `what` otherwise.
void check_tiling(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks, const std::string& what);

// "<what>: <strerror(errno)>" as an Error.
[[noreturn]] void throw_errno(const std::string& what, int error_number);

}  // namespace stowage::dcp::detail
