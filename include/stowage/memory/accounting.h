#pragma once

// Byte accounting of what LibTorch allocates on a device, the counterpart of
// torch.cuda.memory_allocated / max_memory_allocated / reset_peak_memory_stats.
//
// On the CPU, accounting starts with the first call to any function here: stowage then
// wraps c10's CPU allocator, so only allocations made after that point are counted.
// Host staging buffers from memory::allocate_host (pinned, shared or plain) are not
// CPU-allocator allocations and are counted apart, in host_buffer_stats(): on a
// CPU-only build this keeps "device" memory (the tensors a model computes with) and
// host staging memory distinguishable.
//
// The CPU allocator can also cache large blocks (set_cpu_cache_limit), as CUDA's caching
// allocator does for device memory: a buffer allocated and released every step (the swap
// optimizer's arenas, an update's temporaries) is then taken again without the page
// faults of fresh memory, while memory_allocated() still drops when it is released.

#include <c10/core/Device.h>

#include <cstdint>

namespace stowage::memory {

struct MemoryStats {
  int64_t current_bytes = 0;    // live bytes now
  int64_t peak_bytes = 0;       // most live bytes since the last reset_peak
  int64_t allocations = 0;      // allocation calls since accounting started
  int64_t allocated_bytes = 0;  // bytes requested since accounting started
  int64_t cached_bytes = 0;     // released blocks kept for reuse, not in current_bytes
};

// Starts CPU accounting if it has not started. Thread-safe and idempotent.
void enable_accounting();

MemoryStats memory_stats(c10::Device device = c10::kCPU);
inline int64_t memory_allocated(c10::Device device = c10::kCPU) {
  return memory_stats(device).current_bytes;
}
inline int64_t max_memory_allocated(c10::Device device = c10::kCPU) {
  return memory_stats(device).peak_bytes;
}
// Sets the peak to the current value.
void reset_peak_memory_stats(c10::Device device = c10::kCPU);

// Lets the CPU allocator keep released blocks of at least kMinCachedBlockBytes, up to
// `limit_bytes` in all, and hand them to later allocations of exactly their size (a
// block that does not fit under the limit is released as before). 0, the default,
// caches nothing; lowering the limit releases what exceeds it. Starts accounting.
inline constexpr int64_t kMinCachedBlockBytes = int64_t(128) << 10;
void set_cpu_cache_limit(int64_t limit_bytes);
// Returns every cached CPU block to the system (like torch.cuda.empty_cache).
void empty_cpu_cache();

// set_cpu_cache_limit(limit_bytes) for its lifetime, then the limit from before it.
class ScopedCpuCacheLimit {
 public:
  explicit ScopedCpuCacheLimit(int64_t limit_bytes);
  ~ScopedCpuCacheLimit();
  ScopedCpuCacheLimit(const ScopedCpuCacheLimit&) = delete;
  ScopedCpuCacheLimit& operator=(const ScopedCpuCacheLimit&) = delete;

 private:
  int64_t previous_bytes_;
};

}  // namespace stowage::memory
