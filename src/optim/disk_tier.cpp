#include "optim/disk_tier.h"

#include <stowage/memory/host_buffer.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace stowage::optim::detail {

void DiskTier::ensure_buffers(int64_t bytes, c10::Device device) {
  if (bytes == buffer_bytes && static_cast<int64_t>(buffers.size()) == buffer_count) return;
  buffers.clear();  // the old ones go first, so that the tier never holds both
  buffer_bytes = 0;
  memory::HostAllocOptions options;
  options.pin_memory = !device.is_cpu();
  options.pin_for = device.type();
  options.use = memory::HostBufferUse::kOptimizer;
  for (int64_t i = 0; i < buffer_count; ++i) buffers.push_back(memory::allocate_host({bytes}, at::kByte, options));
  buffer_bytes = bytes;
  stats.buffer_bytes = bytes;
  stats.peak_host_bytes = std::max(stats.peak_host_bytes, buffer_count * bytes);
}

at::Tensor map_scratch_file(const std::shared_ptr<dcp::ScratchFile>& file, c10::ScalarType dtype) {
  const int64_t numel = file->size() / static_cast<int64_t>(c10::elementSize(dtype));
  return at::from_blob(
      file->mapping(), {numel}, [file](void*) {}, at::TensorOptions().dtype(dtype));
}

}  // namespace stowage::optim::detail
