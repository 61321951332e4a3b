#include "dcp/format/checks.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>

namespace stowage::dcp::detail {

CheckedCount count_volume(const std::vector<int64_t>& sizes, const std::string& what) {
  int64_t volume = 1;
  for (int64_t size : sizes) {
    if (size < 0) return {0, fmt::format("{}: negative size {}", what, size)};
    if (size != 0 && volume > std::numeric_limits<int64_t>::max() / size) {
      return {0, fmt::format("{}: the size overflows", what)};
    }
    volume *= size;
  }
  return {volume, ""};
}

CheckedCount count_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype, const std::string& what) {
  CheckedCount volume = count_volume(sizes, what);
  if (!volume.ok()) return volume;
  const int64_t element = element_size(dtype);
  if (volume.value > std::numeric_limits<int64_t>::max() / element) {
    return {0, fmt::format("{}: {} elements of {} overflow a byte count", what, volume.value, c10::toString(dtype))};
  }
  return {volume.value * element, ""};
}

std::string tiling_problem(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks,
                           const std::string& what) {
  const CheckedCount total = count_volume(shape, what);
  if (!total.ok()) return total.problem;
  std::vector<int64_t> volumes;
  volumes.reserve(chunks.size());
  int64_t covered = 0;
  for (const ChunkBox& box : chunks) {
    if (box.offsets.size() != shape.size() || box.sizes.size() != shape.size()) {
      return fmt::format("{}: a chunk has {} dimensions, the tensor {}", what, box.sizes.size(), shape.size());
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] > shape[d] - box.sizes[d]) {
        return fmt::format("{}: chunk at [{}] of size [{}] leaves the tensor of shape [{}]", what,
                           fmt::join(box.offsets, ", "), fmt::join(box.sizes, ", "), fmt::join(shape, ", "));
      }
    }
    // Inside the tensor, so its volume is at most the tensor's: no overflow.
    volumes.push_back(count_volume(box.sizes, what).value);
    // The sum stops at the tensor's volume, short of an overflow: boxes inside it that add
    // up to more overlap, which the check below names.
    covered = volumes.back() > total.value - covered ? total.value : covered + volumes.back();
  }
  // Pairwise disjoint boxes inside the tensor whose volumes add up to it tile it.
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (size_t j = i + 1; j < chunks.size(); ++j) {
      bool overlap = volumes[i] != 0 && volumes[j] != 0;
      for (size_t d = 0; overlap && d < shape.size(); ++d) {
        overlap = chunks[i].offsets[d] < chunks[j].offsets[d] + chunks[j].sizes[d] &&
                  chunks[j].offsets[d] < chunks[i].offsets[d] + chunks[i].sizes[d];
      }
      if (overlap) {
        return fmt::format("{}: chunks at [{}] and [{}] overlap", what, fmt::join(chunks[i].offsets, ", "),
                           fmt::join(chunks[j].offsets, ", "));
      }
    }
  }
  if (covered != total.value) return fmt::format("{}: the chunks cover {} of {} elements", what, covered, total.value);
  return "";
}

int64_t checked_volume(const std::vector<int64_t>& sizes, const std::string& what) {
  const CheckedCount volume = count_volume(sizes, what);
  if (!volume.ok()) throw Error(volume.problem);
  return volume.value;
}

int64_t checked_bytes(const std::vector<int64_t>& sizes, c10::ScalarType dtype, const std::string& what) {
  const CheckedCount bytes = count_bytes(sizes, dtype, what);
  if (!bytes.ok()) throw Error(bytes.problem);
  return bytes.value;
}

void check_tiling(const std::vector<int64_t>& shape, const std::vector<ChunkBox>& chunks, const std::string& what) {
  if (const std::string problem = tiling_problem(shape, chunks, what); !problem.empty()) throw Error(problem);
}

}  // namespace stowage::dcp::detail
