#include <stowage/error.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_config.h>
#include <stowage/state/optimizer_adapter.h>

#include "optim/adam_update.h"
#include "optim/param_state.h"

#include <torch/utils.h>

#include <fmt/format.h>

namespace stowage::optim {
namespace {

// AdamW's options and state, plus the fp32 masters; every state tensor is fp32.
class MasterAdamWAdapter final : public OptimizerAdapter {
 public:
  std::string name() const override { return "stowage::optim::MasterAdamW"; }
  bool handles(const torch::optim::Optimizer& optimizer) const override {
    return dynamic_cast<const MasterAdamW*>(&optimizer) != nullptr;
  }
  const std::vector<std::string>& tensor_keys() const override {
    static const std::vector<std::string> keys{kExpAvg, kExpAvgSq, kMaxExpAvgSq, kMasterParam};
    return keys;
  }
  c10::ScalarType state_dtype(const at::Tensor&) const override { return at::kFloat; }
  void write_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& group) const override {
    adamw_adapter().write_options(options, group);
  }
  ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const override {
    return adamw_adapter().read_options(group, where);
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_state() const override {
    return std::make_unique<MasterAdamWParamState>();
  }
  bool has_step() const override { return true; }
  ParamStateFields fields(torch::optim::OptimizerParamState& base) const override {
    auto& state = static_cast<MasterAdamWParamState&>(base);
    return {&state.step(), {&state.exp_avg(), &state.exp_avg_sq(), &state.max_exp_avg_sq(), &state.master_param()}};
  }
};

// Registered on first use, which the initializer below makes the program's start: so the
// registry serves MasterAdamW before any code (a static initializer included) asks.
const std::shared_ptr<const OptimizerAdapter>& registered_adapter() {
  static const std::shared_ptr<const OptimizerAdapter> adapter = [] {
    auto made = std::make_shared<const MasterAdamWAdapter>();
    register_optimizer_adapter(made);
    return made;
  }();
  return adapter;
}
[[maybe_unused]] const bool adapter_registered_at_start = (registered_adapter(), true);

}  // namespace

const OptimizerAdapter& master_adamw_adapter() {
  return *registered_adapter();
}

MasterAdamW::MasterAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                         const torch::optim::AdamWOptions& defaults)
    : Optimizer(std::move(param_groups), std::make_unique<torch::optim::AdamWOptions>(defaults)) {}

MasterAdamW::MasterAdamW(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& defaults)
    : MasterAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

at::Tensor MasterAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const detail::AdamHyperParams hyper =
        detail::adam_hyper_params(group.options(), /*decoupled_weight_decay=*/true, /*fused_on_host=*/true);
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
