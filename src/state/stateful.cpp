#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <fmt/format.h>

#include <sstream>
#include <type_traits>

namespace stowage {
namespace {

// ---------------------------------------------------------------- IValue helpers

std::string tensor_desc(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

c10::IValue require(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const auto it = dict.find(key);
  if (it == dict.end()) {
    throw InvalidArgument(fmt::format("{}: missing entry '{}'", where, key));
  }
  return it->value();
}

double require_double(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require(dict, key, where);
  if (!v.isDouble() && !v.isInt()) {
    throw InvalidArgument(fmt::format("{}: entry '{}' must be a number, got {}", where, key, v.tagKind()));
  }
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool require_bool(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require(dict, key, where);
  if (!v.isBool()) {
    throw InvalidArgument(fmt::format("{}: entry '{}' must be a bool, got {}", where, key, v.tagKind()));
  }
  return v.toBool();
}

c10::impl::GenericDict require_dict(const c10::IValue& v, const std::string& where) {
  if (!v.isGenericDict()) {
    throw InvalidArgument(fmt::format("{} must be a dict, got {}", where, v.tagKind()));
  }
  return v.toGenericDict();
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
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
    const auto& o = static_cast<const Options&>(base);
    out.insert("lr", o.lr());
    out.insert("betas", c10::List<double>({std::get<0>(o.betas()), std::get<1>(o.betas())}));
    out.insert("eps", o.eps());
    out.insert("weight_decay", o.weight_decay());
    out.insert("amsgrad", o.amsgrad());
  };
  kind.read_options = [](const c10::impl::GenericDict& in, const std::string& where) {
    const double lr = require_double(in, "lr", where);
    const c10::IValue betas = require(in, "betas", where);
    if (!betas.isDoubleList() || betas.toDoubleList().size() != 2) {
      throw InvalidArgument(fmt::format("{}: entry 'betas' must be a list of two doubles", where));
    }
    const double beta1 = betas.toDoubleList().get(0);
    const double beta2 = betas.toDoubleList().get(1);
    const double eps = require_double(in, "eps", where);
    const double weight_decay = require_double(in, "weight_decay", where);
    const bool amsgrad = require_bool(in, "amsgrad", where);
    return std::function<void(torch::optim::OptimizerOptions&)>([=](torch::optim::OptimizerOptions& base) {
      auto& o = static_cast<Options&>(base);
      o.lr(lr).betas(std::make_tuple(beta1, beta2)).eps(eps).weight_decay(weight_decay).amsgrad(amsgrad);
    });
  };
  kind.read_state = [](const torch::optim::OptimizerParamState& base) {
    const auto& s = static_cast<const State&>(base);
    return ParamStateView{s.step(), {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()},
                                     {"max_exp_avg_sq", s.max_exp_avg_sq()}}};
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
    const double lr = require_double(in, "lr", where);
    const double momentum = require_double(in, "momentum", where);
    const double dampening = require_double(in, "dampening", where);
    const double weight_decay = require_double(in, "weight_decay", where);
    const bool nesterov = require_bool(in, "nesterov", where);
    return std::function<void(torch::optim::OptimizerOptions&)>([=](torch::optim::OptimizerOptions& base) {
      static_cast<torch::optim::SGDOptions&>(base).lr(lr).momentum(momentum).dampening(dampening)
          .weight_decay(weight_decay).nesterov(nesterov);
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

void ModuleState::load_state_dict(const StateDict& state) {
  const StateDict current = state_dict();
  for (const auto& item : current) {
    if (!state.contains(item.key())) {
      throw InvalidArgument(fmt::format("Module load_state_dict: missing key '{}'", item.key()));
    }
    const c10::IValue value = state.at(item.key());
    if (!value.isTensor()) {
      throw InvalidArgument(fmt::format("Module load_state_dict: '{}' must be a tensor, got {}", item.key(),
                                        value.tagKind()));
    }
    const at::Tensor& src = value.toTensor();
    const at::Tensor& dst = item.value().toTensor();
    if (!src.defined() || src.sizes() != dst.sizes() || src.scalar_type() != dst.scalar_type()) {
      throw InvalidArgument(fmt::format("Module load_state_dict: '{}' is {} but the module expects {}", item.key(),
                                        src.defined() ? tensor_desc(src) : "undefined", tensor_desc(dst)));
    }
  }
  for (const auto& item : state) {
    if (!current.contains(item.key())) {
      throw InvalidArgument(fmt::format("Module load_state_dict: unexpected key '{}'", item.key()));
    }
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : current) {
    item.value().toTensor().copy_(state.at(item.key()).toTensor());
  }
}

// ------------------------------------------------------------- OptimizerState

OptimizerState::OptimizerState(std::shared_ptr<torch::optim::Optimizer> optimizer)
    : optimizer_(std::move(optimizer)) {
  if (!optimizer_) {
    throw InvalidArgument("OptimizerState: null optimizer");
  }
  kind_of(*optimizer_);  // reject unsupported types at construction
}

StateDict OptimizerState::state_dict() {
  const OptimizerKind& kind = kind_of(*optimizer_);
  auto& states = optimizer_->state();
  auto per_param = new_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer_->param_groups()) {
    auto group_dict = new_dict();
    kind.write_options(group.options(), group_dict);
    c10::List<int64_t> ids;
    for (const at::Tensor& param : group.params()) {
      const auto it = states.find(state_key(states, param));
      if (it != states.end()) {
        const ParamStateView view = kind.read_state(*it->second);
        auto entry = new_dict();
        if (view.step) entry.insert("step", *view.step);
        for (const auto& [key, tensor] : view.tensors) {
          if (tensor.defined()) entry.insert(key, tensor);
        }
        per_param.insert(std::to_string(index), entry);
      }
      ids.push_back(index++);
    }
    group_dict.insert("params", ids);
    groups.push_back(group_dict);
  }
  StateDict state;
  state.insert("state", per_param);
  state.insert("param_groups", groups);
  return state;
}

void OptimizerState::load_state_dict(const StateDict& state) {
  const OptimizerKind& kind = kind_of(*optimizer_);
  const std::string where = fmt::format("{} load_state_dict", kind.name);
  if (!state.contains("state") || !state.contains("param_groups")) {
    throw InvalidArgument(where + ": expected entries 'state' and 'param_groups'");
  }
  const auto per_param = require_dict(state.at("state"), where + ": 'state'");
  const c10::IValue groups_value = state.at("param_groups");
  if (!groups_value.isList()) {
    throw InvalidArgument(where + ": 'param_groups' must be a list");
  }
  const auto groups = groups_value.toList();
  auto& param_groups = optimizer_->param_groups();
  if (groups.size() != param_groups.size()) {
    throw InvalidArgument(fmt::format("{}: the state has {} param groups, the optimizer {}", where, groups.size(),
                                      param_groups.size()));
  }

  // Validate everything and prepare the changes, then apply them all.
  std::vector<at::Tensor> params;
  std::vector<std::function<void(torch::optim::OptimizerOptions&)>> apply_options;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group_where = fmt::format("{}: param_groups.{}", where, g);
    const auto group = require_dict(groups.get(g), group_where);
    const c10::IValue ids = require(group, "params", group_where);
    const size_t expected = param_groups[g].params().size();
    if (!ids.isIntList() || ids.toIntList().size() != expected) {
      throw InvalidArgument(fmt::format("{}: 'params' must list {} parameter ids", group_where, expected));
    }
    apply_options.push_back(kind.read_options(group, group_where));
    for (const at::Tensor& p : param_groups[g].params()) params.push_back(p);
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> new_states(params.size());
  for (const auto& item : per_param) {
    const std::string id = item.key().toStringRef();
    const std::string param_where = fmt::format("{}: state.{}", where, id);
    size_t index = 0;
    try {
      size_t used = 0;
      index = std::stoull(id, &used);
      if (used != id.size()) throw std::invalid_argument(id);
    } catch (const std::exception&) {
      throw InvalidArgument(param_where + ": the key is not a parameter id");
    }
    if (index >= params.size()) {
      throw InvalidArgument(fmt::format("{}: there are only {} parameters", param_where, params.size()));
    }
    const at::Tensor& param = params[index];
    const auto entry = require_dict(item.value(), param_where);
    ParamStateView view;
    if (kind.has_step) {
      const c10::IValue step = require(entry, "step", param_where);
      if (!step.isInt()) {
        throw InvalidArgument(fmt::format("{}: 'step' must be an int, got {}", param_where, step.tagKind()));
      }
      view.step = step.toInt();
    }
    for (const char* key : kind.tensor_keys) {
      const auto it = entry.find(key);
      if (it == entry.end()) continue;
      if (!it->value().isTensor() || it->value().toTensor().sizes() != param.sizes()) {
        throw InvalidArgument(fmt::format("{}.{}: expected a tensor of shape [{}], got {}", param_where, key,
                                          fmt::join(param.sizes(), ", "),
                                          it->value().isTensor() ? tensor_desc(it->value().toTensor())
                                                                 : it->value().tagKind()));
      }
      view.tensors.emplace_back(key, it->value().toTensor().to(param.device(), param.scalar_type(),
                                                               /*non_blocking=*/false, /*copy=*/true));
    }
    for (const auto& field : entry) {
      const std::string& key = field.key().toStringRef();
      const bool known = (kind.has_step && key == "step") ||
                         std::any_of(kind.tensor_keys.begin(), kind.tensor_keys.end(),
                                     [&](const char* k) { return key == k; });
      if (!known) {
        throw InvalidArgument(fmt::format("{}: unexpected entry '{}' for {}", param_where, key, kind.name));
      }
    }
    new_states[index] = kind.make_state(view);
  }

  auto& states = optimizer_->state();
  states.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (new_states[i]) {
      states[state_key(states, params[i])] = std::move(new_states[i]);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    apply_options[g](param_groups[g].options());
  }
}

}  // namespace stowage
