#pragma once

// The per-parameter Adam/AdamW update, shared by every optimizer of this module. On
// tensors of any device it performs exactly the tensor operations of LibTorch's
// Adam::step and AdamW::step, with the same scalars and in the same order wherever one
// operation reads what another writes, so that results are bit for bit equal. With
// fused_on_host, host fp32 tensors take the same operations per element in one fused pass
// (optim/fused_adam.h): bit for bit on LibTorch 1.13, within its documented bound on 2.x.

#include <stowage/state/optimizer_layout.h>

#include <torch/optim/optimizer.h>

#include <cstdint>

namespace stowage::optim::detail {

// The options an update reads; AdamW decays the parameter, Adam adds weight_decay * param
// to the gradient.
struct AdamHyperParams : AdamOptionValues {
  bool decoupled_weight_decay = false;
  // Whether host fp32 tensors take the fused pass: set for stowage's optimizers, whose
  // update is documented as fused (FusedAdamW, MasterAdamW), so that LibTorch's Adam and
  // AdamW, wrapped or not, stay bit for bit LibTorch's on every version.
  bool fused_on_host = false;
};

// Reads AdamOptions (decoupled = false) or AdamWOptions (decoupled = true).
AdamHyperParams adam_hyper_params(const torch::optim::OptimizerOptions& options, bool decoupled_weight_decay,
                                  bool fused_on_host);

// Throws InvalidArgument when amsgrad is on and max_exp_avg_sq is undefined.
void require_amsgrad_state(const AdamHyperParams& hyper, const at::Tensor& max_exp_avg_sq);

// One update of `param` (in place) with the moments (in place); `step` is the count after
// this update (1 on the first). max_exp_avg_sq is used only with amsgrad, and must then be
// defined. The update allocates its temporaries before its first write, so that an
// allocation failure leaves every tensor unchanged; the caller checks beforehand that
// the gradient matches the parameter (dtype, shape, device), so that nothing after the
// first write can fail.
void adam_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                 const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                 const AdamHyperParams& hyper);

// The MasterAdamW update: adam_update on the fp32 master with the gradient cast to fp32,
// then the master copied (rounded) into the parameter. Allocates before its first write,
// as adam_update does.
void master_adamw_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                         const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq,
                         int64_t step, const AdamHyperParams& hyper);

}  // namespace stowage::optim::detail
