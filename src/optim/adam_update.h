#pragma once

// The per-parameter Adam/AdamW update, shared by every optimizer of this module. It
// performs exactly the tensor operations of LibTorch's Adam::step and AdamW::step, in
// the same order and with the same scalars, so that results are bit for bit equal.

#include <torch/optim/optimizer.h>

#include <cstdint>

namespace stowage::optim::detail {

struct AdamHyperParams {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool amsgrad = false;
  // AdamW: decay the parameter; Adam: add weight_decay * param to the gradient.
  bool decoupled_weight_decay = false;
};

// Reads AdamOptions (decoupled = false) or AdamWOptions (decoupled = true).
AdamHyperParams adam_hyper_params(const torch::optim::OptimizerOptions& options, bool decoupled_weight_decay);

// One update of `param` (in place) with the moments (in place); `step` is the count after
// this update (1 on the first). max_exp_avg_sq is used only with amsgrad.
void adam_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                 const AdamHyperParams& hyper);

// The MasterAdamW update: adam_update on the fp32 master with the gradient cast to fp32,
// then the master copied (rounded) into the parameter.
void master_adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                         const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq,
                         int64_t step, const AdamHyperParams& hyper);

}  // namespace stowage::optim::detail
