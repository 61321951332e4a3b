#include <stowage/error.h>
#include <stowage/optim/fused_adamw.h>

#include "optim/adam_update.h"
#include "optim/fused_adam.h"
#include "state/optimizer_state_key.h"

#include <torch/utils.h>

#include <fmt/format.h>

namespace stowage::optim {
namespace {

// Why the parameter (its gradient, its state) can't be updated, or "".
std::string unfusable(const at::Tensor& param, const torch::optim::AdamWParamState* state, bool amsgrad) {
  std::vector<std::pair<const at::Tensor*, const char*>> tensors{{&param, "parameter"}, {&param.grad(), "gradient"}};
  if (state != nullptr) {
    tensors.insert(tensors.end(), {{&state->exp_avg(), "exp_avg"}, {&state->exp_avg_sq(), "exp_avg_sq"}});
    if (amsgrad && !state->max_exp_avg_sq().defined()) {
      return "amsgrad is on but it has no max_exp_avg_sq state (amsgrad was enabled after the state was created)";
    }
    if (amsgrad) tensors.emplace_back(&state->max_exp_avg_sq(), "max_exp_avg_sq");
  }
  for (const auto& [tensor, what] : tensors) {
    std::string why = detail::fused_adam_unsupported(*tensor, what, param);
    if (!why.empty()) return why;
  }
  return "";
}

// Every parameter is checked before the first is updated, so that a bad one leaves the
// model and the state as they were.
template <typename StateMap>
void require_fusable(const std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    const bool amsgrad = static_cast<const torch::optim::AdamWOptions&>(groups[g].options()).amsgrad();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      const std::string why = unfusable(
          params[i], static_cast<const torch::optim::AdamWParamState*>(stowage::detail::find_state(states, params[i])),
          amsgrad);
      if (!why.empty()) {
        throw InvalidArgument(fmt::format("FusedAdamW: parameter {} of group {} can't be updated: {}", i, g, why));
      }
    }
  }
}

}  // namespace

at::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  require_fusable(param_groups_, state_);
  for (auto& group : param_groups_) {
    const detail::AdamHyperParams hyper =
        detail::adam_hyper_params(group.options(), /*decoupled_weight_decay=*/true, /*fused_on_host=*/true);
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      auto key = stowage::detail::state_key(state_, param);
      if (state_.find(key) == state_.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(at::zeros_like(param, at::MemoryFormat::Contiguous));
        fresh->exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Contiguous));
        if (hyper.amsgrad) fresh->max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Contiguous));
        state_[key] = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*state_[key]);
      state.step(state.step() + 1);
      detail::fused_adam_update(param, param.grad(), state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq(),
                                state.step(), hyper);
    }
  }
  return loss;
}

}  // namespace stowage::optim
