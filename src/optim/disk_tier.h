#pragma once

// What the swap optimizer's disk tier keeps from step to step: its I/O path and its host
// buffers (allocated, and pinned, once rather than every step), the test seam for I/O
// faults, and its counters.

#include <stowage/optim/swap_optimizer.h>

#include "optim/swap_file_io.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace stowage::optim::detail {

// Test seam, like memory::CopyEngine's fault injector: called before each batch's read or
// write of the scratch files; a nonzero errno fails that I/O as the kernel would. A failed
// write first writes the first half of the batch's first range, as a write that runs out
// of space part way does.
using DiskFaultInjector = std::function<int(IoOp op, int64_t batch)>;
void set_disk_fault_injector(SwapOptimizer& optimizer, DiskFaultInjector injector);

struct DiskTier {
  DiskTier(SwapIoPath path, int64_t buffer_count) : io(make_swap_file_io(path)), buffer_count(buffer_count) {}

  // buffer_count buffers of `bytes` each (kDiskAlignmentBytes-aligned), pinned for
  // `device` unless it is the CPU, reusing the current ones when they are that size already.
  void ensure_buffers(int64_t bytes, c10::Device device);

  std::unique_ptr<SwapFileIo> io;
  int64_t buffer_count;
  std::vector<at::Tensor> buffers;  // bytes, page aligned
  int64_t buffer_bytes = 0;
  DiskFaultInjector fault;
  DiskTierStats stats;
};

}  // namespace stowage::optim::detail
