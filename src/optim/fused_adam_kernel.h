#pragma once

// The fused Adam/AdamW update's inner loop over fp32 arrays: one pass that reads p, g, m, v
// (and max v with amsgrad) once and writes p, m, v (and max v) once: 28 bytes an element
// without amsgrad, the floor of any host update. LibTorch's per-op update makes about ten
// passes over the same memory.
//
// Each element goes through LibTorch's AdamW::step (and Adam::step) operations, in their
// order, each rounded to fp32 as ATen's CPU kernels round them. The kernels compile with
// -ffp-contract=off and fuse a multiply and an add exactly where ATen's AVX kernels were
// found to (add_ with alpha, addcmul_); the default kernel, like ATen's, fuses nothing.
// Measured against torch::optim::AdamW (tests/optim/fused_adamw_test.cpp): bit for bit
// on Debian's 1.13; within 4 fp32 epsilons of each element's scale on PyTorch 2.11's
// wheel, whose fp32 sqrt is not always correctly rounded.
//
// One copy of the loop is compiled for each CPU capability, as ATen's kernels are
// (fused_adam_kernel_<capability>.cpp, each in its own CPU_CAPABILITY namespace);
// fused_adam_kernel() picks the widest one this CPU runs.

#include <cstdint>

namespace stowage::optim::detail {

// One run of elements: each array holds `size` floats. max_exp_avg_sq is null unless
// the scalars' amsgrad is set.
struct FusedAdamRun {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  int64_t size = 0;
};

// An update's scalars, in fp32 as ATen's CPU kernels apply scalars to fp32 tensors.
struct FusedAdamScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  bool decay_param = false;  // AdamW's decay: the parameter is first multiplied by param_decay
  float param_decay = 1;     // 1 - lr * weight_decay
  bool decay_grad = false;   // Adam's L2 term: grad_decay * param is added to the gradient
  float grad_decay = 0;      // weight_decay
  bool amsgrad = false;
  float bias_correction2_sqrt = 1;
  float eps = 0;
  float neg_step_size = 0;  // -lr / bias_correction1
};

using FusedAdamKernel = void (*)(const FusedAdamRun& run, const FusedAdamScalars& scalars);

// A CPU capability's kernel, and whether this build and this CPU have it.
enum class CpuCapability : std::uint8_t { kDefault, kAvx2, kAvx512 };
bool cpu_runs(CpuCapability capability);
// REQUIRES: cpu_runs(capability).
FusedAdamKernel fused_adam_kernel(CpuCapability capability);

// The widest kernel this CPU runs.
FusedAdamKernel fused_adam_kernel();

// Each capability's copy (fused_adam_kernel_<capability>.cpp); the x86 ones exist in x86
// builds only.
FusedAdamKernel fused_adam_kernel_default();
FusedAdamKernel fused_adam_kernel_avx2();
FusedAdamKernel fused_adam_kernel_avx512();

}  // namespace stowage::optim::detail
