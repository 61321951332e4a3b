#pragma once

// What the swap optimizer's disk tier keeps from step to step: its I/O path and its host
// buffers (allocated, and pinned, once rather than every step), the env its I/O goes
// through, and its counters.

#include <stowage/optim/swap_optimizer.h>

#include "optim/swap_env.h"
#include "optim/swap_file_io.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace stowage::optim::detail {

struct DiskTier {
  DiskTier(SwapEnv* env, SwapIoPath path, int64_t buffer_count)
      : env(env), io(make_swap_file_io(path)), buffer_count(buffer_count) {}

  // buffer_count buffers of `bytes` each (kDiskAlignmentBytes-aligned), pinned for
  // `device` unless it is the CPU, reusing the current ones when they are that size already.
  void ensure_buffers(int64_t bytes, c10::Device device);

  SwapEnv* env;
  std::unique_ptr<SwapFileIo> io;
  int64_t buffer_count;
  std::vector<at::Tensor> buffers;  // bytes, page aligned
  int64_t buffer_bytes = 0;
  DiskTierStats stats;
};

}  // namespace stowage::optim::detail
