#include <stowage/error.h>
#include <stowage/optim/master_adamw.h>

#include "optim/adam_update.h"
#include "optim/param_state.h"

#include <torch/utils.h>

#include <fmt/format.h>

namespace stowage::optim {

MasterAdamW::MasterAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                         torch::optim::AdamWOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<torch::optim::AdamWOptions>(defaults)) {}

MasterAdamW::MasterAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults)
    : MasterAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor MasterAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const detail::AdamHyperParams hyper = detail::adam_hyper_params(group.options(), /*decoupled=*/true);
    for (auto& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw InvalidArgument("MasterAdamW does not support sparse gradients");
      }
      auto key = detail::state_key(state_, param);
      if (state_.find(key) == state_.end()) {
        auto fresh = std::make_unique<MasterAdamWParamState>();
        const auto fp32 = param.options().dtype(at::kFloat);
        fresh->exp_avg(at::zeros_like(param, fp32, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(param, fp32, at::MemoryFormat::Preserve));
        if (hyper.amsgrad) fresh->max_exp_avg_sq(at::zeros_like(param, fp32, at::MemoryFormat::Preserve));
        fresh->master_param(param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
        state_[key] = std::move(fresh);
      }
      auto& state = static_cast<MasterAdamWParamState&>(*state_[key]);
      state.step(state.step() + 1);
      detail::master_adamw_update(param, grad, state.master_param(), state.exp_avg(), state.exp_avg_sq(),
                                  state.max_exp_avg_sq(), state.step(), hyper);
    }
  }
  return loss;
}

}  // namespace stowage::optim
