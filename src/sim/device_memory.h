#pragma once

// The simulator's device memory: a c10::DeviceAllocator over host memory with a capacity
// per device, CUDA-like statistics, and the bookkeeping that makes stream hazards visible.
//
// Invariants, per device, whenever its mutex is free:
//  - live + pending + cached <= max(capacity, what was live when the capacity was lowered);
//  - a block is in exactly one of: live (owned by a DataPtr), pending (freed, waiting for
//    the streams it was used on to drain), cached (poisoned, ready for reuse);
//  - a cached block's every byte is kPoison, unless a copy nobody ordered wrote it since
//    (which is the hazard this exists to show).

#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <string>

namespace stowage::sim::detail {

constexpr unsigned char kPoison = 0xFF;  // NaN in every floating-point type

struct Block;

enum class Access { kRead, kWrite };

class DeviceMemory final : public c10::DeviceAllocator {
 public:
  static DeviceMemory& instance();

  // Allocates on the calling thread's current device. Throws c10::OutOfMemoryError past
  // the device's capacity.
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  // Synchronizes the devices' streams, then returns their cached blocks to the system.
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;  // (free, total)
};

// The block holding `tensor`'s memory; nullptr for a tensor that is not sim memory or
// has none.
Block* block_of(const at::Tensor& tensor);

// The life of a copy queued on `stream` that will `access` the block: queued, then running
// (from when its worker takes it, through its delay, until its bytes have moved), then
// finished. REQUIRES: the three calls in this order, once each per copy.
void copy_queued(Block* block, const c10::Stream& stream, Access access);
void copy_running(Block* block, const c10::Stream& stream, Access access);
void copy_finished(Block* block, const c10::Stream& stream, Access access);

// Which copies of other streams a new access of the block conflicts with.
enum class Rival {
  // Queued or running. What runs on the calling thread does so once its stream has
  // drained: everything its stream waited for has finished, so a copy still unfinished
  // on another stream is not ordered before it, queued or not.
  kUnfinished,
  // Running. What runs on a stream's worker may be ordered before a copy still queued
  // on another stream (that stream waits for it), so only copies running meanwhile
  // conflict.
  kRunning,
};

// Empty, or the message of the hazard when `what` (e.g. "aten::add") on `stream`
// `access`es the block while a rival copy on another stream writes it (or, when `access`
// is a write, reads it).
std::string find_conflict(Block* block, const c10::Stream& stream, Access access, Rival rival, const std::string& what);

}  // namespace stowage::sim::detail
