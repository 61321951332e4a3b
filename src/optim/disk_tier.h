#pragma once

// What the swap optimizer's disk tier keeps from step to step: the file system its scratch
// files and their reads and writes go through (a dcp::Env, as a checkpoint's files do), its
// batch I/O and its host buffers (allocated, and pinned, once rather than every step), and
// its counters.

#include <stowage/dcp/env.h>
#include <stowage/optim/swap_optimizer.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace stowage::optim::detail {

// The tier's file offsets and lengths, and its buffers, are multiples of this: what a
// direct scratch file's batch I/O needs.
inline constexpr int64_t kDiskAlignmentBytes = dcp::kDirectIoAlignment;

struct DiskTier {
  // `files` null: dcp::Env::posix().
  DiskTier(dcp::Env* files, SwapIoPath path, int64_t buffer_count)
      : files(files != nullptr ? files : dcp::Env::posix()),
        io(this->files->new_batch_io(path)),
        buffer_count(buffer_count) {}

  // buffer_count buffers of `bytes` each (kDiskAlignmentBytes-aligned), pinned for
  // `device` unless it is the CPU, reusing the current ones when they are that size already.
  void ensure_buffers(int64_t bytes, c10::Device device);

  dcp::Env* files;
  std::unique_ptr<dcp::BatchIo> io;
  int64_t buffer_count;
  std::vector<at::Tensor> buffers;  // bytes, page aligned
  int64_t buffer_bytes = 0;
  DiskTierStats stats;
};

// The whole of `file` as a 1-D tensor of `dtype` over its mapping: reads come from the
// file, stores reach it. The tensor keeps the file open and mapped.
at::Tensor map_scratch_file(const std::shared_ptr<dcp::ScratchFile>& file, c10::ScalarType dtype);

}  // namespace stowage::optim::detail
