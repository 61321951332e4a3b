#pragma once

// The loop of src/optim/fused_adam_kernel.h, included only by the
// fused_adam_kernel_<capability>.cpp files. Each defines CPU_CAPABILITY (and ATen's
// CPU_CAPABILITY_<name>) and compiles with that capability's flags, so that this code and
// the ATen Vectorized it inlines live in a namespace of the capability's own: no copy built
// for one CPU can stand in for another at link time.

#include "optim/fused_adam_kernel.h"

#include <ATen/cpu/vec/vec.h>

#ifndef CPU_CAPABILITY
#error "fused_adam_kernel_loop.h is compiled once per CPU capability: define CPU_CAPABILITY"
#endif

namespace stowage::optim::detail {
inline namespace CPU_CAPABILITY {

using FloatVector = at::vec::Vectorized<float>;

// The scalars as vectors, made once per run.
struct VectorScalars {
  explicit VectorScalars(const FusedAdamScalars& s)
      : beta1(s.beta1),
        one_minus_beta1(s.one_minus_beta1),
        beta2(s.beta2),
        one_minus_beta2(s.one_minus_beta2),
        param_decay(s.param_decay),
        grad_decay(s.grad_decay),
        bias_correction2_sqrt(s.bias_correction2_sqrt),
        eps(s.eps),
        neg_step_size(s.neg_step_size) {}
  FloatVector beta1, one_minus_beta1, beta2, one_minus_beta2, param_decay, grad_decay, bias_correction2_sqrt, eps,
      neg_step_size;
};

// Elements [at, at + count) of the run, count <= FloatVector::size(). Each line is one
// operation of LibTorch's AdamW::step / Adam::step, in its order.
inline void update_vector(const FusedAdamRun& run, const FusedAdamScalars& s, const VectorScalars& v, int64_t at,
                          int count) {
  FloatVector param = FloatVector::loadu(run.param + at, count);
  FloatVector grad = FloatVector::loadu(run.grad + at, count);
  if (s.decay_grad) grad = at::vec::fmadd(param, v.grad_decay, grad);                 // grad.add(param, wd)
  if (s.decay_param) param = param * v.param_decay;                                   // param.mul_(1 - lr * wd)
  FloatVector exp_avg = FloatVector::loadu(run.exp_avg + at, count) * v.beta1;        // exp_avg.mul_(beta1)
  exp_avg = at::vec::fmadd(grad, v.one_minus_beta1, exp_avg);                         //   .add_(grad, 1 - beta1)
  FloatVector exp_avg_sq = FloatVector::loadu(run.exp_avg_sq + at, count) * v.beta2;  // exp_avg_sq.mul_(beta2)
  // .addcmul_(grad, grad, 1 - beta2): ATen's build fuses its self + value * t1 * t2
  exp_avg_sq = at::vec::fmadd(v.one_minus_beta2 * grad, grad, exp_avg_sq);
  FloatVector second_moment = exp_avg_sq;
  if (s.amsgrad) {
    second_moment = at::vec::maximum(exp_avg_sq, FloatVector::loadu(run.max_exp_avg_sq + at, count));
    second_moment.store(run.max_exp_avg_sq + at, count);
  }
  const FloatVector denom = second_moment.sqrt() / v.bias_correction2_sqrt + v.eps;
  param = param + v.neg_step_size * exp_avg / denom;  // param.addcdiv_(exp_avg, denom, -step_size)
  param.store(run.param + at, count);
  exp_avg.store(run.exp_avg + at, count);
  exp_avg_sq.store(run.exp_avg_sq + at, count);
}

inline void fused_adam_loop(const FusedAdamRun& run, const FusedAdamScalars& scalars) {
  const VectorScalars vectors(scalars);
  constexpr int kWidth = FloatVector::size();
  int64_t at = 0;
  for (; at + kWidth <= run.size; at += kWidth) update_vector(run, scalars, vectors, at, kWidth);
  if (at < run.size) update_vector(run, scalars, vectors, at, static_cast<int>(run.size - at));
}

}  // namespace CPU_CAPABILITY
}  // namespace stowage::optim::detail
