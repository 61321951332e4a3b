#pragma once

// AdamW for low-precision parameters (bf16, fp16) that keeps fp32 master weights.
//
// Each step runs AdamW's update, in fp32, on the master copy of a parameter (with the
// gradient cast to fp32) and then writes the master, rounded, back into the parameter.
// The moments are fp32 too. Without masters, small updates of a bf16 parameter round
// away; with them they accumulate. On the host the update is FusedAdamW's one pass
// (optim/fused_adamw.h, and its bound against LibTorch's AdamW); on a device, LibTorch's
// AdamW operations.

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <vector>

namespace stowage {
class OptimizerAdapter;
}  // namespace stowage

namespace stowage::optim {

struct MasterAdamWParamState : public torch::optim::OptimizerCloneableParamState<MasterAdamWParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, max_exp_avg_sq) = {};
  // fp32; the parameter is always this, rounded to the parameter's dtype.
  TORCH_ARG(at::Tensor, master_param);
};

class MasterAdamW : public torch::optim::Optimizer {
 public:
  explicit MasterAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       const torch::optim::AdamWOptions& defaults = {});
  explicit MasterAdamW(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;
};

// How stowage::OptimizerState and SwapOptimizer read and write a MasterAdamW's state: its
// AdamW options, and per parameter the step, the fp32 moments and the fp32 master
// ("master_param"). Registered with stowage::register_optimizer_adapter when the program
// starts.
const OptimizerAdapter& master_adamw_adapter();

}  // namespace stowage::optim
