#pragma once

// Host memory for staging: exact-size allocations (no power-of-two rounding), page
// aligned, optionally page-locked (pinned) or shareable with other processes, handed
// out as ordinary CPU tensors that free their memory when the last reference goes.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace stowage::memory {

struct HostAllocOptions {
  // Page-locked, when the build has a device runtime that can pin (see can_pin_memory).
  bool pin_memory = false;
  // Backed by a memfd, so that another process can map the same pages.
  bool share_memory = false;
};

// True when this build and machine can page-lock host memory for a device.
bool can_pin_memory();

// Whether `tensor`'s memory is page-locked for a device.
bool is_pinned(const at::Tensor& tensor);

// A contiguous CPU tensor of uninitialised memory. Pinning is best effort: it silently
// falls back to pageable memory where can_pin_memory() is false.
at::Tensor allocate_host(c10::IntArrayRef sizes, c10::ScalarType dtype, HostAllocOptions options = {});

struct HostBufferStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t pinned_bytes = 0;  // of current_bytes, those page-locked
  int64_t shared_bytes = 0;  // of current_bytes, those memfd-backed
};
HostBufferStats host_buffer_stats();
void reset_peak_host_buffer_stats();

}  // namespace stowage::memory
