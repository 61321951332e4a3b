#pragma once

// A SwapEnv that fails, on request, any call the swap optimizer makes through its seam: a
// copy or a parameter's update. Each fault is a function the test sets (or clears, with
// an empty one) between steps; the calls no fault claims go to the real env. The disk
// tier's file calls go through a dcp::Env, which tests fail with
// dcp::testing::FaultInjectionEnv (tests/dcp/fault_injection_env.h), as checkpoints' are.

#include <stowage/optim/swap_env.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>

namespace stowage::optim::testing {

class FaultInjectionSwapEnv : public SwapEnv {
 public:
  // Runs just before each copy, with its lane and number on that lane (as CopyEnv::copy
  // gets them); throwing fails the copy, after the fault wrote what it likes to `dst`.
  using CopyFault = std::function<void(memory::CopyLane lane, int64_t copy_number, const at::Tensor& dst)>;
  // Runs before the update of parameter `param_index`; throwing fails the update.
  using UpdateFault = std::function<void(int64_t param_index)>;

  // REQUIRES: no step() running.
  void set_copy_fault(CopyFault fault) { copy_fault_ = std::move(fault); }
  void set_update_fault(UpdateFault fault) { update_fault_ = std::move(fault); }

  void copy(memory::CopyLane lane, int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) override {
    if (copy_fault_) copy_fault_(lane, copy_number, dst);
    SwapEnv::copy(lane, copy_number, dst, src);
  }

  void before_update(int64_t param_index) override {
    if (update_fault_) update_fault_(param_index);
  }

 private:
  CopyFault copy_fault_;
  UpdateFault update_fault_;
};

}  // namespace stowage::optim::testing
