#include <stowage/error.h>
#include <stowage/state/destination.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>
#include <stowage/state/stateful.h>

#include "state/optimizer_state_key.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace stowage {
namespace {

// ---------------------------------------------------------------- IValue helpers

std::string tensor_desc(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

}  // namespace

// ------------------------------------------------------------------ capsules

void Stateful::check_load_state_dict(const StateDict&) {}

bool Stateful::needs_saved_entry(const ObjectPath&) const {
  return true;
}

std::vector<ObjectPath> Stateful::entries_written_in_forward() {
  return {};
}

c10::IValue as_ivalue(c10::intrusive_ptr<Stateful> object) {
  if (!object) {
    throw InvalidArgument("as_ivalue: null Stateful");
  }
  return c10::IValue::make_capsule(std::move(object));
}

c10::intrusive_ptr<Stateful> as_stateful(const c10::IValue& value) {
  if (!value.isCapsule()) {
    return {};
  }
  c10::intrusive_ptr<torch::CustomClassHolder> holder = value.toCapsule();
  auto* stateful = dynamic_cast<Stateful*>(holder.get());
  if (stateful == nullptr) {
    return {};
  }
  return c10::intrusive_ptr<Stateful>::reclaim_copy(stateful);
}

c10::IValue as_ivalue(std::shared_ptr<torch::nn::Module> module) {
  return as_ivalue(c10::make_intrusive<ModuleState>(std::move(module)));
}

c10::IValue as_ivalue(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  return as_ivalue(c10::make_intrusive<OptimizerState>(std::move(optimizer)));
}

// ---------------------------------------------------------------- ModuleState

ModuleState::ModuleState(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {
  if (!module_) {
    throw InvalidArgument("ModuleState: null module");
  }
}

StateDict ModuleState::state_dict() {
  StateDict state;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    state.insert(item.key(), item.value().detach());
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) {
      state.insert(item.key(), item.value().detach());
    }
  }
  return state;
}

std::vector<ObjectPath> ModuleState::entries_written_in_forward() {
  std::vector<ObjectPath> buffers;
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (item.value().defined()) buffers.push_back({item.key()});
  }
  return buffers;
}

void ModuleState::check_load_state_dict(const StateDict& state) {
  const StateDict current = state_dict();
  for (const auto& item : current) {
    if (!state.contains(item.key())) {
      throw InvalidArgument(fmt::format("Module load_state_dict: missing key '{}'", item.key()));
    }
    const c10::IValue value = state.at(item.key());
    if (!value.isTensor()) {
      throw InvalidArgument(
          fmt::format("Module load_state_dict: '{}' must be a tensor, got {}", item.key(), value.tagKind()));
    }
    const at::Tensor& src = value.toTensor();
    const at::Tensor& dst = item.value().toTensor();
    if (!src.defined() || src.sizes() != dst.sizes() || src.scalar_type() != dst.scalar_type()) {
      throw InvalidArgument(fmt::format("Module load_state_dict: '{}' is {} but the module expects {}", item.key(),
                                        src.defined() ? tensor_desc(src) : "undefined", tensor_desc(dst)));
    }
    check_writable_destination(dst, fmt::format("Module load_state_dict: '{}'", item.key()));
  }
  for (const auto& item : state) {
    if (!current.contains(item.key())) {
      throw InvalidArgument(fmt::format("Module load_state_dict: unexpected key '{}'", item.key()));
    }
  }
}

void ModuleState::load_state_dict(const StateDict& state) {
  check_load_state_dict(state);
  torch::NoGradGuard no_grad;
  for (const auto& item : state_dict()) {
    item.value().toTensor().copy_(state.at(item.key()).toTensor());
  }
}

// ------------------------------------------------------------- OptimizerState

namespace {

const char* const kOptimizerState = "OptimizerState";

}  // namespace

OptimizerState::OptimizerState(std::shared_ptr<torch::optim::Optimizer> optimizer) : optimizer_(std::move(optimizer)) {
  if (!optimizer_) {
    throw InvalidArgument("OptimizerState: null optimizer");
  }
  adapter_ = &optimizer_adapter(*optimizer_, kOptimizerState);  // rejects an unsupported type now
}

StateDict OptimizerState::state_dict() {
  check_not_claimed();
  return write_adapter_state(*adapter_, *optimizer_);
}

StateDict write_adapter_state(const OptimizerAdapter& adapter, torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  return write_optimizer_layout(
      optimizer,
      [&](const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& group) {
        adapter.write_options(options, group);
      },
      [&](const at::Tensor& param, c10::impl::GenericDict& entry) {
        torch::optim::OptimizerParamState* state = detail::find_state(states, param);
        if (state == nullptr) return false;
        const ParamStateFields fields = adapter.fields(*state);
        if (fields.step != nullptr) entry.insert("step", *fields.step);
        const std::vector<std::string>& keys = adapter.tensor_keys();
        for (size_t i = 0; i < keys.size(); ++i) {
          if (fields.tensors[i]->defined()) entry.insert(keys[i], *fields.tensors[i]);
        }
        return true;
      });
}

namespace {

// An optimizer state dict checked against `optimizer`: its layout, and what applies each
// group's options.
struct CheckedOptimizerState {
  OptimizerLayout layout;
  std::vector<ApplyOptions> apply_options;
};

void check_state_entry(const OptimizerAdapter& adapter, const OptimizerLayout::Entry& entry, const at::Tensor& param) {
  if (adapter.has_step()) require_int(entry.fields, "step", entry.where);
  const std::vector<std::string>& keys = adapter.tensor_keys();
  for (const auto& field : entry.fields) {
    const std::string& key = field.key().toStringRef();
    if (adapter.has_step() && key == "step") continue;
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      throw InvalidArgument(fmt::format("{}: unexpected entry '{}' for {}", entry.where, key, adapter.name()));
    }
    const c10::IValue& value = field.value();
    if (!value.isTensor() || !value.toTensor().defined() || value.toTensor().sizes() != param.sizes()) {
      throw InvalidArgument(fmt::format("{}.{}: expected a tensor of shape [{}], got {}", entry.where, key,
                                        fmt::join(param.sizes(), ", "),
                                        value.isTensor() && value.toTensor().defined() ? tensor_desc(value.toTensor())
                                                                                       : std::string(value.tagKind())));
    }
  }
}

CheckedOptimizerState check_optimizer_state(const OptimizerAdapter& adapter, const StateDict& state,
                                            torch::optim::Optimizer& optimizer) {
  CheckedOptimizerState checked{
      read_optimizer_layout(state, optimizer, fmt::format("{} load_state_dict", adapter.name())), {}};
  for (const OptimizerLayout::Group& group : checked.layout.groups) {
    checked.apply_options.push_back(adapter.read_options(group.options, group.where));
  }
  for (const OptimizerLayout::Entry& entry : checked.layout.entries) {
    check_state_entry(adapter, entry, checked.layout.params[entry.param]);
  }
  return checked;
}

}  // namespace

void OptimizerState::check_not_claimed() const {
  optimizer_adapter(*optimizer_, kOptimizerState);  // a SwapOptimizer may have wrapped it since construction
}

void OptimizerState::check_load_state_dict(const StateDict& state) {
  check_not_claimed();
  check_optimizer_state(*adapter_, state, *optimizer_);
}

void OptimizerState::load_state_dict(const StateDict& state) {
  check_not_claimed();
  const CheckedOptimizerState checked = check_optimizer_state(*adapter_, state, *optimizer_);
  const OptimizerLayout& layout = checked.layout;

  // Prepare the new states (copies onto each parameter's device, in the optimizer's state
  // dtype), then apply them all.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> new_states(layout.params.size());
  const std::vector<std::string>& keys = adapter_->tensor_keys();
  for (const OptimizerLayout::Entry& entry : layout.entries) {
    const at::Tensor& param = layout.params[entry.param];
    std::unique_ptr<torch::optim::OptimizerParamState> fresh = adapter_->new_state();
    const ParamStateFields fields = adapter_->fields(*fresh);
    if (fields.step != nullptr) *fields.step = entry.fields.at("step").toInt();
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto it = entry.fields.find(keys[i]);
      if (it == entry.fields.end()) continue;
      *fields.tensors[i] = it->value().toTensor().to(param.device(), adapter_->state_dtype(param),
                                                     /*non_blocking=*/false, /*copy=*/true);
    }
    new_states[entry.param] = std::move(fresh);
  }

  auto& states = optimizer_->state();
  states.clear();
  for (size_t i = 0; i < layout.params.size(); ++i) {
    if (new_states[i]) {
      states[detail::state_key(states, layout.params[i])] = std::move(new_states[i]);
    }
  }
  auto& param_groups = optimizer_->param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    checked.apply_options[g](param_groups[g].options());
  }
}

}  // namespace stowage
