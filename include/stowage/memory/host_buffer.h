#pragma once

// Host memory for staging: exact-size allocations (no power-of-two rounding), page
// aligned, optionally page-locked (pinned) or shareable with other processes, handed
// out as ordinary CPU tensors that free their memory when the last reference goes.

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace stowage::memory {

// What a host buffer holds, for host_buffer_stats()' breakdown.
enum class HostBufferUse {
  kOther,
  kCheckpoint,  // checkpoint staging: snapshots of the state to save, copies ahead of a load
  kOptimizer,   // optimizer states swapped out of the device, and the disk tier's buffers
};

struct HostAllocOptions {
  // Page-locked for devices of type pin_for, where that device's runtime can pin (see
  // can_pin_memory).
  bool pin_memory = false;
  // Backed by a memfd, so that another process can map the same pages. Pinning for a
  // device other than CUDA takes the memory from that device's pinned allocator, which
  // cannot share it: share_memory then wins.
  bool share_memory = false;
  c10::DeviceType pin_for = c10::DeviceType::CUDA;
  HostBufferUse use = HostBufferUse::kOther;
};

// True when this build and machine can page-lock host memory for devices of `device_type`:
// CUDA with a GPU present; on LibTorch 2.x, any accelerator with a pinned-memory allocator
// registered (at::getHostAllocator), such as the simulated device of stowage/sim/sim.h.
bool can_pin_memory(c10::DeviceType device_type = c10::DeviceType::CUDA);

// Whether `tensor`'s memory is page-locked for a device (CUDA, or a registered
// PrivateUse1 device).
bool is_pinned(const at::Tensor& tensor);

// A contiguous CPU tensor of uninitialised memory. Pinning is best effort: it silently
// falls back to pageable memory where can_pin_memory(options.pin_for) is false.
at::Tensor allocate_host(c10::IntArrayRef sizes, c10::ScalarType dtype, HostAllocOptions options = {});

// The shape and dtype of one tensor allocate_host_tensors makes.
struct HostTensorSpec {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::kFloat;
};

// Where allocate_host_tensors places each tensor in its arena.
constexpr int64_t kHostArenaAlignment = 64;

// The bytes allocate_host maps, and host_buffer_stats() counts, for a buffer of `nbytes`:
// whole pages (none for 0).
int64_t host_allocation_bytes(int64_t nbytes);

// Contiguous CPU tensors of uninitialised memory, one per spec, in order, carved out of
// as few allocate_host() allocations (arenas) as fit: tensors are packed in order, each
// at a kHostArenaAlignment boundary, into arenas of at most `max_arena_bytes`; a tensor
// larger than that gets an arena of its own. So a memfd descriptor, a mapping and a pin
// registration serve many small tensors, and their number grows with the bytes, not
// with the tensor count. An arena's memory is freed when the last tensor carved from it
// (or a view of one) goes. Throws InvalidArgument for a negative size.
std::vector<at::Tensor> allocate_host_tensors(const std::vector<HostTensorSpec>& specs, HostAllocOptions options,
                                              int64_t max_arena_bytes);

struct HostBufferStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t pinned_bytes = 0;      // of current_bytes, those page-locked
  int64_t shared_bytes = 0;      // of current_bytes, those memfd-backed
  int64_t checkpoint_bytes = 0;  // of current_bytes, HostBufferUse::kCheckpoint's
  int64_t optimizer_bytes = 0;   // of current_bytes, HostBufferUse::kOptimizer's
  // The most checkpoint_bytes reached since the last reset_peak_host_buffer_stats().
  int64_t checkpoint_peak_bytes = 0;
};
HostBufferStats host_buffer_stats();
void reset_peak_host_buffer_stats();

}  // namespace stowage::memory
