#pragma once

// The simulator's page-locked ("pinned") host memory: what tensor.pin_memory() and
// at::getHostAllocator(PrivateUse1) hand out. Only copies from or to it are queued on a
// stream; a copy with pageable memory completes before it returns, as on CUDA.

#include <ATen/core/CachingHostAllocator.h>

namespace stowage::sim::detail {

class PinnedMemory final : public at::HostAllocator {
 public:
  static PinnedMemory& instance();

  at::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // Nothing is cached (each block is freed when its last user goes), so there is no event
  // to record, no cache to empty and no statistic but the pinned bytes below.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override;
  void empty_cache() override {}
  at::HostStats get_stats() override;
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  // Whether `data` points into a live pinned block.
  bool contains(const void* data);
};

}  // namespace stowage::sim::detail
