#include <stowage/error.h>
#include <stowage/state/destination.h>
#include <stowage/state/optimizer_layout.h>
#include <stowage/state/stateful.h>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>
#include <type_traits>

namespace stowage {
namespace {

// ---------------------------------------------------------------- IValue helpers

std::string tensor_desc(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

// ------------------------------------------------------ optimizer state layouts
//
// LibTorch keys optimizer state by the parameter's TensorImpl: a pointer string in
// 1.13, the pointer itself in 2.x. The key type is read off the map, so both build.
template <typename Key>
Key make_state_key(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // the format c10::guts::to_string used
    out << impl;
    return out.str();
  } else {
    return static_cast<Key>(impl);
  }
}

template <typename StateMap>
auto state_key(const StateMap&, const at::Tensor& param) {
  return make_state_key<typename StateMap::key_type>(param.unsafeGetTensorImpl());
}

// A parameter's state, as named tensors plus an optional step count.
struct ParamStateView {
  c10::optional<int64_t> step;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Everything that differs between optimizer types.
struct OptimizerKind {
  const char* name;
  std::vector<const char*> tensor_keys;
  bool has_step;
  std::function<void(const torch::optim::OptimizerOptions&, c10::impl::GenericDict&)> write_options;
  // Validates (throws) and returns a function that applies the options.
  std::function<std::function<void(torch::optim::OptimizerOptions&)>(const c10::impl::GenericDict&, const std::string&)>
      read_options;
  std::function<ParamStateView(const torch::optim::OptimizerParamState&)> read_state;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const ParamStateView&)> make_state;
};

template <typename Options>
OptimizerKind adam_like(const char* name) {
  using torch::optim::AdamParamState;  // AdamW's state has the same fields
  using State = std::conditional_t<std::is_same_v<Options, torch::optim::AdamOptions>, torch::optim::AdamParamState,
                                   torch::optim::AdamWParamState>;
  OptimizerKind kind;
  kind.name = name;
  kind.tensor_keys = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  kind.has_step = true;
  kind.write_options = [](const torch::optim::OptimizerOptions& base, c10::impl::GenericDict& out) {
    write_adam_options(adam_option_values(static_cast<const Options&>(base)), out);
  };
  kind.read_options = [](const c10::impl::GenericDict& in, const std::string& where) {
    const AdamOptionValues v = read_adam_options(in, where);
    return std::function<void(torch::optim::OptimizerOptions&)>(
        [=](torch::optim::OptimizerOptions& base) { apply_adam_options(v, static_cast<Options&>(base)); });
  };
  kind.read_state = [](const torch::optim::OptimizerParamState& base) {
    const auto& s = static_cast<const State&>(base);
    return ParamStateView{
        s.step(), {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}, {"max_exp_avg_sq", s.max_exp_avg_sq()}}};
  };
  kind.make_state = [](const ParamStateView& view) {
    auto s = std::make_unique<State>();
    s->step(*view.step);
    for (const auto& [key, tensor] : view.tensors) {
      if (key == "exp_avg") s->exp_avg(tensor);
      if (key == "exp_avg_sq") s->exp_avg_sq(tensor);
      if (key == "max_exp_avg_sq") s->max_exp_avg_sq(tensor);
    }
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(s));
  };
  return kind;
}

OptimizerKind sgd() {
  OptimizerKind kind;
  kind.name = "SGD";
  kind.tensor_keys = {"momentum_buffer"};
  kind.has_step = false;
  kind.write_options = [](const torch::optim::OptimizerOptions& base, c10::impl::GenericDict& out) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(base);
    out.insert("lr", o.lr());
    out.insert("momentum", o.momentum());
    out.insert("dampening", o.dampening());
    out.insert("weight_decay", o.weight_decay());
    out.insert("nesterov", o.nesterov());
  };
  kind.read_options = [](const c10::impl::GenericDict& in, const std::string& where) {
    const double lr = require_number(in, "lr", where);
    const double momentum = require_number(in, "momentum", where);
    const double dampening = require_number(in, "dampening", where);
    const double weight_decay = require_number(in, "weight_decay", where);
    const bool nesterov = require_bool(in, "nesterov", where);
    return std::function<void(torch::optim::OptimizerOptions&)>([=](torch::optim::OptimizerOptions& base) {
      static_cast<torch::optim::SGDOptions&>(base)
          .lr(lr)
          .momentum(momentum)
          .dampening(dampening)
          .weight_decay(weight_decay)
          .nesterov(nesterov);
    });
  };
  kind.read_state = [](const torch::optim::OptimizerParamState& base) {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(base);
    return ParamStateView{c10::nullopt, {{"momentum_buffer", s.momentum_buffer()}}};
  };
  kind.make_state = [](const ParamStateView& view) {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    for (const auto& [key, tensor] : view.tensors) {
      if (key == "momentum_buffer") s->momentum_buffer(tensor);
    }
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(s));
  };
  return kind;
}

const OptimizerKind& kind_of(const torch::optim::Optimizer& optimizer) {
  static const OptimizerKind adam = adam_like<torch::optim::AdamOptions>("Adam");
  static const OptimizerKind adamw = adam_like<torch::optim::AdamWOptions>("AdamW");
  static const OptimizerKind sgd_kind = sgd();
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return adamw;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return adam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return sgd_kind;
  throw InvalidArgument(fmt::format("OptimizerState supports torch::optim::Adam, AdamW and SGD; got {}",
                                    c10::demangle(typeid(optimizer).name())));
}

}  // namespace

// ------------------------------------------------------------------ capsules

void Stateful::check_load_state_dict(const StateDict&) {}

bool Stateful::needs_saved_entry(const ObjectPath&) const {
  return true;
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

OptimizerState::OptimizerState(std::shared_ptr<torch::optim::Optimizer> optimizer) : optimizer_(std::move(optimizer)) {
  if (!optimizer_) {
    throw InvalidArgument("OptimizerState: null optimizer");
  }
  kind_of(*optimizer_);  // reject unsupported types at construction
}

StateDict OptimizerState::state_dict() {
  const OptimizerKind& kind = kind_of(*optimizer_);
  auto& states = optimizer_->state();
  return write_optimizer_layout(*optimizer_, kind.write_options,
                                [&](const at::Tensor& param, c10::impl::GenericDict& entry) {
                                  const auto it = states.find(state_key(states, param));
                                  if (it == states.end()) return false;
                                  const ParamStateView view = kind.read_state(*it->second);
                                  if (view.step) entry.insert("step", *view.step);
                                  for (const auto& [key, tensor] : view.tensors) {
                                    if (tensor.defined()) entry.insert(key, tensor);
                                  }
                                  return true;
                                });
}

namespace {

// An optimizer state dict checked against `optimizer`: its layout, and the functions
// that apply each group's options.
struct CheckedOptimizerState {
  OptimizerLayout layout;
  std::vector<std::function<void(torch::optim::OptimizerOptions&)>> apply_options;
};

CheckedOptimizerState check_optimizer_state(const OptimizerKind& kind, const StateDict& state,
                                            torch::optim::Optimizer& optimizer) {
  CheckedOptimizerState checked{read_optimizer_layout(state, optimizer, fmt::format("{} load_state_dict", kind.name)),
                                {}};
  for (const OptimizerLayout::Group& group : checked.layout.groups) {
    checked.apply_options.push_back(kind.read_options(group.options, group.where));
  }
  for (const OptimizerLayout::Entry& entry : checked.layout.entries) {
    const at::Tensor& param = checked.layout.params[entry.param];
    if (kind.has_step) require_int(entry.fields, "step", entry.where);
    for (const auto& field : entry.fields) {
      const std::string& key = field.key().toStringRef();
      const bool known =
          (kind.has_step && key == "step") ||
          std::any_of(kind.tensor_keys.begin(), kind.tensor_keys.end(), [&](const char* k) { return key == k; });
      if (!known) {
        throw InvalidArgument(fmt::format("{}: unexpected entry '{}' for {}", entry.where, key, kind.name));
      }
      if (key == "step") continue;
      const c10::IValue& value = field.value();
      if (!value.isTensor() || !value.toTensor().defined() || value.toTensor().sizes() != param.sizes()) {
        throw InvalidArgument(fmt::format(
            "{}.{}: expected a tensor of shape [{}], got {}", entry.where, key, fmt::join(param.sizes(), ", "),
            value.isTensor() && value.toTensor().defined() ? tensor_desc(value.toTensor())
                                                           : std::string(value.tagKind())));
      }
    }
  }
  return checked;
}

}  // namespace

void OptimizerState::check_load_state_dict(const StateDict& state) {
  check_optimizer_state(kind_of(*optimizer_), state, *optimizer_);
}

void OptimizerState::load_state_dict(const StateDict& state) {
  const OptimizerKind& kind = kind_of(*optimizer_);
  const CheckedOptimizerState checked = check_optimizer_state(kind, state, *optimizer_);
  const OptimizerLayout& layout = checked.layout;

  // Prepare the new states (copies onto each parameter's device and dtype), then apply
  // them all.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> new_states(layout.params.size());
  for (const OptimizerLayout::Entry& entry : layout.entries) {
    const at::Tensor& param = layout.params[entry.param];
    ParamStateView view;
    if (kind.has_step) view.step = entry.fields.at("step").toInt();
    for (const char* key : kind.tensor_keys) {
      const auto it = entry.fields.find(key);
      if (it == entry.fields.end()) continue;
      view.tensors.emplace_back(key, it->value().toTensor().to(param.device(), param.scalar_type(),
                                                               /*non_blocking=*/false, /*copy=*/true));
    }
    new_states[entry.param] = kind.make_state(view);
  }

  auto& states = optimizer_->state();
  states.clear();
  for (size_t i = 0; i < layout.params.size(); ++i) {
    if (new_states[i]) {
      states[state_key(states, layout.params[i])] = std::move(new_states[i]);
    }
  }
  auto& param_groups = optimizer_->param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    checked.apply_options[g](param_groups[g].options());
  }
}

}  // namespace stowage
