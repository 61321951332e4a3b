#pragma once

// A SwapEnv that fails, on request, any call the swap optimizer makes through its seam: a
// copy, a batch's read or write of the disk tier, or a parameter's update. Each fault is
// a function the test sets (or clears, with an empty one) between steps; the calls no
// fault claims go to the real env.

#include "optim/swap_env.h"
#include "optim/swap_internal.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace stowage::optim::testing {

class FaultInjectionSwapEnv : public SwapEnv {
 public:
  // Runs just before each copy, with its lane and number on that lane (as CopyEnv::copy
  // gets them); throwing fails the copy, after the fault wrote what it likes to `dst`.
  using CopyFault = std::function<void(memory::CopyLane lane, int64_t copy_number, const at::Tensor& dst)>;
  // Returns an errno to fail batch `batch`'s read or write as the kernel would, or 0. A
  // failed write first writes the first half of the batch's first range, as a write that
  // runs out of space part way does.
  using DiskFault = std::function<int(detail::IoOp op, int64_t batch)>;
  // Runs before the update of parameter `param_index`; throwing fails the update.
  using UpdateFault = std::function<void(int64_t param_index)>;

  // REQUIRES: no step() running.
  void set_copy_fault(CopyFault fault) { copy_fault_ = std::move(fault); }
  void set_disk_fault(DiskFault fault) { disk_fault_ = std::move(fault); }
  void set_update_fault(UpdateFault fault) { update_fault_ = std::move(fault); }

  void copy(memory::CopyLane lane, int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) override {
    if (copy_fault_) copy_fault_(lane, copy_number, dst);
    SwapEnv::copy(lane, copy_number, dst, src);
  }

  void transfer(detail::IoOp op, int64_t batch, detail::SwapFileIo& io,
                const std::vector<detail::IoRequest>& requests) override {
    if (disk_fault_) {
      if (const int error = disk_fault_(op, batch); error != 0) fail_part_way(op, io, requests, error);
    }
    SwapEnv::transfer(op, batch, io, requests);
  }

  void before_update(int64_t param_index) override {
    if (update_fault_) update_fault_(param_index);
  }

 private:
  [[noreturn]] static void fail_part_way(detail::IoOp op, detail::SwapFileIo& io,
                                         std::vector<detail::IoRequest> requests, int error) {
    if (requests.empty()) detail::throw_io_error(op, "", 0, 0, error);  // a batch with nothing swapped
    requests.resize(1);
    if (op == detail::IoOp::kWrite) {
      requests[0].bytes = detail::align_up(requests[0].bytes / 2, detail::kDiskAlignmentBytes);
      io.run(op, requests);
    }
    detail::throw_io_error(op, requests[0].file, requests[0].offset, requests[0].bytes, error);
  }

  CopyFault copy_fault_;
  DiskFault disk_fault_;
  UpdateFault update_fault_;
};

}  // namespace stowage::optim::testing
