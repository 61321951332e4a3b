#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include "memory/portable_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <c10/core/CachingDeviceAllocator.h>
#elif defined(STOWAGE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace stowage::memory {
namespace {

// Wraps c10's CPU allocator. Each allocation carries a header holding its size, so
// that both DataPtr deleters and raw_deallocate can account for the free. Invariant:
// current_ counts live bytes only; cached blocks are counted in cached_ alone, and
// cached_ <= cache_limit_ whenever cache_mutex_ is free.
class TrackingAllocator final : public PortableAllocator {
 public:
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate_bytes(size_t nbytes) const override {
    void* data = allocate_raw(nbytes);
    return {data, data, &TrackingAllocator::deallocate_raw, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::deallocate_raw; }

  MemoryStats stats() const {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    return {current_.load(), peak_.load(), allocations_.load(), allocated_.load(), cached_};
  }
  void reset_peak() { peak_.store(current_.load()); }

  // Returns the limit before.
  int64_t set_cache_limit(int64_t limit) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const int64_t previous = std::exchange(cache_limit_, limit);
    trim_locked();
    return previous;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const int64_t limit = std::exchange(cache_limit_, 0);
    trim_locked();
    cache_limit_ = limit;
  }

 private:
  // 64 bytes keeps the alignment c10's allocator guarantees (gAlignment).
  static constexpr size_t kHeader = 64;
  struct Header {
    size_t nbytes;
    TrackingAllocator* owner;
  };

  void* allocate_raw(size_t nbytes) const {
    void* base = take_cached(nbytes);
    if (base == nullptr) base = inner_->raw_allocate(nbytes + kHeader);
    auto* header = static_cast<Header*>(base);
    header->nbytes = nbytes;
    header->owner = const_cast<TrackingAllocator*>(this);
    const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    allocations_.fetch_add(1);
    allocated_.fetch_add(static_cast<int64_t>(nbytes));
    return static_cast<char*>(base) + kHeader;
  }

  static void deallocate_raw(void* data) {
    if (data == nullptr) {
      return;
    }
    void* base = static_cast<char*>(data) - kHeader;
    const auto* header = static_cast<Header*>(base);
    TrackingAllocator* owner = header->owner;
    owner->current_.fetch_sub(static_cast<int64_t>(header->nbytes));
    if (!owner->keep_cached(base, header->nbytes)) owner->inner_->raw_deallocate(base);
  }

  // A cached block of exactly `nbytes`, or nullptr.
  void* take_cached(size_t nbytes) const {
    if (static_cast<int64_t>(nbytes) < kMinCachedBlockBytes) return nullptr;
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(nbytes);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* base = it->second.back();
    it->second.pop_back();
    cached_ -= static_cast<int64_t>(nbytes);
    return base;
  }

  // Whether the released block `base` went into the cache.
  bool keep_cached(void* base, size_t nbytes) {
    if (static_cast<int64_t>(nbytes) < kMinCachedBlockBytes) return false;
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cached_ + static_cast<int64_t>(nbytes) > cache_limit_) return false;
    cache_[nbytes].push_back(base);
    cached_ += static_cast<int64_t>(nbytes);
    return true;
  }

  // Releases cached blocks until cached_ <= cache_limit_; needs cache_mutex_.
  void trim_locked() {
    for (auto it = cache_.begin(); it != cache_.end() && cached_ > cache_limit_;) {
      while (!it->second.empty() && cached_ > cache_limit_) {
        inner_->raw_deallocate(it->second.back());
        it->second.pop_back();
        cached_ -= static_cast<int64_t>(it->first);
      }
      it = it->second.empty() ? cache_.erase(it) : std::next(it);
    }
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
  mutable std::atomic<int64_t> allocations_{0};
  mutable std::atomic<int64_t> allocated_{0};

  mutable std::mutex cache_mutex_;                                // guards the three below
  mutable std::unordered_map<size_t, std::vector<void*>> cache_;  // by the blocks' nbytes
  mutable int64_t cached_ = 0;
  int64_t cache_limit_ = 0;
};

TrackingAllocator& cpu_tracker() {
  // Never destroyed: tensors freed during static destruction still reach it.
  static TrackingAllocator* tracker = [] {
    auto* t = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(t, /*priority=*/1);
    return t;
  }();
  return *tracker;
}

#if TORCH_VERSION_MAJOR >= 2
// The device allocator serving `device`, or null where its type has none registered (or
// has one that keeps no statistics).
c10::DeviceAllocator* device_allocator(c10::Device device) {
  try {
    return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(device.type()));
  } catch (const c10::Error&) {  // none registered
    return nullptr;
  }
}
#endif

[[maybe_unused]] c10::DeviceIndex index_of(c10::Device device) {
  return device.has_index() ? device.index() : c10::DeviceIndex(0);
}

[[noreturn]] void unsupported(c10::Device device) {
  throw InvalidArgument(fmt::format("memory accounting is not available for device {} in this build", device.str()));
}

// Throws InvalidArgument naming `caller` for a negative cache limit.
void require_cache_limit(int64_t limit_bytes, const char* caller) {
  if (limit_bytes < 0) {
    throw InvalidArgument(fmt::format("{}: the limit must be >= 0 bytes, got {}", caller, limit_bytes));
  }
}

}  // namespace

void enable_accounting() {
  cpu_tracker();
}

void set_cpu_cache_limit(int64_t limit_bytes) {
  require_cache_limit(limit_bytes, "set_cpu_cache_limit");
  cpu_tracker().set_cache_limit(limit_bytes);
}

void empty_cpu_cache() {
  cpu_tracker().empty_cache();
}

ScopedCpuCacheLimit::ScopedCpuCacheLimit(int64_t limit_bytes) {
  require_cache_limit(limit_bytes, "ScopedCpuCacheLimit");
  previous_bytes_ = cpu_tracker().set_cache_limit(limit_bytes);
}

ScopedCpuCacheLimit::~ScopedCpuCacheLimit() {
  cpu_tracker().set_cache_limit(previous_bytes_);
}

MemoryStats memory_stats(c10::Device device) {
  if (device.is_cpu()) {
    return cpu_tracker().stats();
  }
#if TORCH_VERSION_MAJOR >= 2
  // Every accelerator's allocator answers through c10::DeviceAllocator: CUDA's, a
  // PrivateUse1 device's (stowage/sim/sim.h), XPU's.
  if (c10::DeviceAllocator* allocator = device_allocator(device)) {
    const auto stats = allocator->getDeviceStats(index_of(device));
    const auto& bytes = stats.allocated_bytes[0];  // StatType::AGGREGATE
    return {bytes.current, bytes.peak, stats.allocation[0].allocated, bytes.allocated,
            stats.reserved_bytes[0].current - bytes.current};
  }
#elif defined(STOWAGE_WITH_CUDA)
  if (device.is_cuda()) {  // LibTorch 1.13 has no device-generic allocator interface
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index_of(device));
    const auto& bytes = stats.allocated_bytes[0];  // StatType::AGGREGATE
    return {bytes.current, bytes.peak, stats.allocation[0].allocated, bytes.allocated};
  }
#endif
  unsupported(device);
}

void reset_peak_memory_stats(c10::Device device) {
  if (device.is_cpu()) {
    cpu_tracker().reset_peak();
    return;
  }
#if TORCH_VERSION_MAJOR >= 2
  if (c10::DeviceAllocator* allocator = device_allocator(device)) {
    allocator->resetPeakStats(index_of(device));
    return;
  }
#elif defined(STOWAGE_WITH_CUDA)
  if (device.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(index_of(device));
    return;
  }
#endif
  unsupported(device);
}

}  // namespace stowage::memory
