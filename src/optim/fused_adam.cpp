#include "optim/fused_adam.h"

#include "optim/fused_adam_kernel.h"
#include "util/intra_op_threads.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace stowage::optim::detail {
namespace {

// Elements a thread takes at a time: 128 KiB of each array, as ATen's own grain.
constexpr int64_t kGrain = 32768;

// LibTorch computes each scalar in double from the options and the step count, and ATen
// applies it to fp32 tensors as fp32.
FusedAdamScalars scalars_of(const AdamHyperParams& hyper, int64_t step) {
  const double bias_correction1 = 1 - std::pow(hyper.beta1, step);
  const double bias_correction2 = 1 - std::pow(hyper.beta2, step);
  FusedAdamScalars s;
  s.beta1 = static_cast<float>(hyper.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - hyper.beta1);
  s.beta2 = static_cast<float>(hyper.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - hyper.beta2);
  s.decay_param = hyper.weight_decay != 0 && hyper.decoupled_weight_decay;
  s.param_decay = static_cast<float>(1 - hyper.lr * hyper.weight_decay);
  s.decay_grad = hyper.weight_decay != 0 && !hyper.decoupled_weight_decay;
  s.grad_decay = static_cast<float>(hyper.weight_decay);
  s.amsgrad = hyper.amsgrad;
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(hyper.eps);
  s.neg_step_size = static_cast<float>(-(hyper.lr / bias_correction1));
  return s;
}

}  // namespace

std::string fused_adam_unsupported(const at::Tensor& tensor, const char* what, const at::Tensor& param) {
  if (!tensor.device().is_cpu()) return fmt::format("its {} is on {}, not the CPU", what, tensor.device().str());
  if (tensor.is_sparse()) return fmt::format("its {} is sparse", what);
  if (tensor.scalar_type() != at::kFloat) {
    return fmt::format("its {} is {}, not fp32", what, c10::toString(tensor.scalar_type()));
  }
  if (!tensor.is_contiguous()) return fmt::format("its {} is not contiguous", what);
  if (tensor.sizes() != param.sizes()) {
    return fmt::format("its {}'s shape [{}] is not the parameter's [{}]", what, fmt::join(tensor.sizes(), ", "),
                       fmt::join(param.sizes(), ", "));
  }
  return "";
}

void fused_adam_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                       const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                       const AdamHyperParams& hyper) {
  require_amsgrad_state(hyper, max_exp_avg_sq);
  const FusedAdamScalars scalars = scalars_of(hyper, step);
  const FusedAdamKernel kernel = fused_adam_kernel();
  FusedAdamRun whole;
  whole.param = param.data_ptr<float>();
  whole.grad = grad.data_ptr<float>();
  whole.exp_avg = exp_avg.data_ptr<float>();
  whole.exp_avg_sq = exp_avg_sq.data_ptr<float>();
  whole.max_exp_avg_sq = hyper.amsgrad ? max_exp_avg_sq.data_ptr<float>() : nullptr;
  util::parallel_over_elements(param, kGrain, [&](int64_t begin, int64_t end) {
    FusedAdamRun run = whole;
    run.param += begin;
    run.grad += begin;
    run.exp_avg += begin;
    run.exp_avg_sq += begin;
    if (run.max_exp_avg_sq != nullptr) run.max_exp_avg_sq += begin;
    run.size = end - begin;
    kernel(run, scalars);
  });
}

}  // namespace stowage::optim::detail
