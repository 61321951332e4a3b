#include "optim/adam_update.h"

#include "optim/fused_adam.h"

#include <stowage/error.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>

namespace stowage::optim::detail {

AdamHyperParams adam_hyper_params(const torch::optim::OptimizerOptions& options, bool decoupled_weight_decay,
                                  bool fused_on_host) {
  AdamHyperParams hyper;
  static_cast<AdamOptionValues&>(hyper) =
      decoupled_weight_decay ? adam_option_values(static_cast<const torch::optim::AdamWOptions&>(options))
                             : adam_option_values(static_cast<const torch::optim::AdamOptions&>(options));
  hyper.decoupled_weight_decay = decoupled_weight_decay;
  hyper.fused_on_host = fused_on_host;
  return hyper;
}

void require_amsgrad_state(const AdamHyperParams& hyper, const at::Tensor& max_exp_avg_sq) {
  if (hyper.amsgrad && !max_exp_avg_sq.defined()) {
    throw InvalidArgument(
        "Adam update: amsgrad is on but the parameter has no max_exp_avg_sq state (amsgrad was "
        "enabled after the state was created)");
  }
}

namespace {

// Whether the update takes the fused pass: asked for, and every tensor host fp32, dense
// and contiguous.
bool fusable(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
             const at::Tensor& max_exp_avg_sq, const AdamHyperParams& hyper) {
  if (!hyper.fused_on_host) return false;
  for (const at::Tensor* tensor : {&param, &grad, &exp_avg, &exp_avg_sq}) {
    if (!fused_adam_unsupported(*tensor, "", param).empty()) return false;
  }
  return !hyper.amsgrad || fused_adam_unsupported(max_exp_avg_sq, "", param).empty();
}

// LibTorch's operations, one pass over memory each.
void adam_update_op_by_op(const at::Tensor& param, const at::Tensor& grad_in, const at::Tensor& exp_avg,
                          const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                          const AdamHyperParams& hyper) {
  const double beta1 = hyper.beta1;
  const double beta2 = hyper.beta2;
  // std::pow(double, int64_t), as LibTorch computes it from the int64_t step count.
  const auto bias_correction1 = 1 - std::pow(beta1, step);
  const auto bias_correction2 = 1 - std::pow(beta2, step);

  // The temporaries come first, so that a failure to allocate them changes nothing.
  at::Tensor grad = grad_in;
  if (hyper.weight_decay != 0 && !hyper.decoupled_weight_decay) {
    grad = grad.add(param, hyper.weight_decay);
  }
  // LibTorch writes (sqrt / c).add_(eps) with a second temporary; dividing in place
  // computes the same values and keeps the update's extra memory to one tensor.
  at::Tensor denom = at::empty_like(exp_avg_sq);

  // AdamW's decay reads and writes only the parameter, so doing it here rather than first
  // (as LibTorch does) gives the same values.
  if (hyper.weight_decay != 0 && hyper.decoupled_weight_decay) {
    param.mul_(1 - hyper.lr * hyper.weight_decay);
  }
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  if (hyper.amsgrad) {
    at::Tensor running_max = max_exp_avg_sq;
    at::max_out(running_max, exp_avg_sq, max_exp_avg_sq);
    at::sqrt_out(denom, max_exp_avg_sq);
  } else {
    at::sqrt_out(denom, exp_avg_sq);
  }
  denom.div_(std::sqrt(bias_correction2)).add_(hyper.eps);
  const auto step_size = hyper.lr / bias_correction1;
  param.addcdiv_(exp_avg, denom, -step_size);
}

}  // namespace

void adam_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                 const AdamHyperParams& hyper) {
  require_amsgrad_state(hyper, max_exp_avg_sq);
  if (fusable(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper)) {
    fused_adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, hyper);
  } else {
    adam_update_op_by_op(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step, hyper);
  }
}

void master_adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                         const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq,
                         int64_t step, const AdamHyperParams& hyper) {
  adam_update(master, grad.to(at::kFloat), exp_avg, exp_avg_sq, max_exp_avg_sq, step, hyper);
  param.copy_(master);
}

}  // namespace stowage::optim::detail
