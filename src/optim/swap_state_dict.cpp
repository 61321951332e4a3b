// SwapOptimizer's checkpoint support: the wrapped optimizer's state in
// stowage::OptimizerState's layout, with swapped states handed out and taken in as host
// tensors.

#include <stowage/error.h>
#include <stowage/optim/swap_optimizer.h>

#include "optim/adam_update.h"
#include "optim/swap_internal.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <fmt/format.h>

namespace stowage::optim {

using detail::Family;
using detail::SlotRequest;
using detail::Source;

namespace {

c10::impl::GenericDict new_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

c10::IValue require(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const auto it = dict.find(key);
  if (it == dict.end()) {
    throw InvalidArgument(fmt::format("{}: missing entry '{}'", where, key));
  }
  return it->value();
}

double require_number(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require(dict, key, where);
  if (!v.isDouble() && !v.isInt()) {
    throw InvalidArgument(fmt::format("{}: entry '{}' must be a number, got {}", where, key, v.tagKind()));
  }
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

c10::impl::GenericDict require_dict(const c10::IValue& v, const std::string& where) {
  if (!v.isGenericDict()) {
    throw InvalidArgument(fmt::format("{} must be a dict, got {}", where, v.tagKind()));
  }
  return v.toGenericDict();
}

std::string describe(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

void write_options(const detail::AdamHyperParams& h, c10::impl::GenericDict& out) {
  out.insert("lr", h.lr);
  out.insert("betas", c10::List<double>({h.beta1, h.beta2}));
  out.insert("eps", h.eps);
  out.insert("weight_decay", h.weight_decay);
  out.insert("amsgrad", h.amsgrad);
}

void apply_options(Family family, const detail::AdamHyperParams& h, torch::optim::OptimizerOptions& options) {
  auto apply = [&](auto& o) {
    o.lr(h.lr).betas(std::make_tuple(h.beta1, h.beta2)).eps(h.eps).weight_decay(h.weight_decay).amsgrad(h.amsgrad);
  };
  if (family == Family::kAdam) {
    apply(static_cast<torch::optim::AdamOptions&>(options));
  } else {
    apply(static_cast<torch::optim::AdamWOptions&>(options));
  }
}

detail::AdamHyperParams read_options(const c10::impl::GenericDict& group, const std::string& where) {
  detail::AdamHyperParams h;
  h.lr = require_number(group, "lr", where);
  const c10::IValue betas = require(group, "betas", where);
  if (!betas.isDoubleList() || betas.toDoubleList().size() != 2) {
    throw InvalidArgument(fmt::format("{}: entry 'betas' must be a list of two doubles", where));
  }
  h.beta1 = betas.toDoubleList().get(0);
  h.beta2 = betas.toDoubleList().get(1);
  h.eps = require_number(group, "eps", where);
  h.weight_decay = require_number(group, "weight_decay", where);
  const c10::IValue amsgrad = require(group, "amsgrad", where);
  if (!amsgrad.isBool()) {
    throw InvalidArgument(fmt::format("{}: entry 'amsgrad' must be a bool, got {}", where, amsgrad.tagKind()));
  }
  h.amsgrad = amsgrad.toBool();
  return h;
}

}  // namespace

StateDict SwapOptimizer::state_dict() {
  // The caller reads the host buffers on the CPU: the downloads into them must be done.
  engine_->synchronize(host_ready_);
  auto& states = optimizer_->state();
  auto per_param = new_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer_->param_groups()) {
    auto group_dict = new_dict();
    write_options(detail::adam_hyper_params(group.options(), family_ != Family::kAdam), group_dict);
    c10::List<int64_t> ids;
    for (const at::Tensor& param : group.params()) {
      if (torch::optim::OptimizerParamState* state = detail::find_state(states, param)) {
        const detail::ParamStateRef ref = detail::state_ref(family_, *state);
        auto entry = new_dict();
        entry.insert("step", *ref.step);
        for (int slot = 0; slot < detail::kSlotCount; ++slot) {
          if (ref.tensors[slot] != nullptr && ref.tensors[slot]->defined()) {
            entry.insert(detail::slot_name(slot), *ref.tensors[slot]);
          }
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

void SwapOptimizer::load_state_dict(const StateDict& state) {
  const std::string where = "SwapOptimizer load_state_dict";
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

  // Validate everything and build the new states; change nothing until all is checked.
  std::vector<detail::AdamHyperParams> options;
  std::vector<at::Tensor> params;
  std::vector<size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string group_where = fmt::format("{}: param_groups.{}", where, g);
    const auto group = require_dict(groups.get(g), group_where);
    const c10::IValue ids = require(group, "params", group_where);
    const size_t expected = param_groups[g].params().size();
    if (!ids.isIntList() || ids.toIntList().size() != expected) {
      throw InvalidArgument(fmt::format("{}: 'params' must list {} parameter ids", group_where, expected));
    }
    options.push_back(read_options(group, group_where));
    for (const at::Tensor& p : param_groups[g].params()) {
      params.push_back(p);
      group_of.push_back(g);
    }
  }

  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> new_states(params.size());
  // Sources of the swapped states, by parameter and then slot, the layout's order.
  std::vector<std::vector<SlotRequest>> requests_by_param(params.size());
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
    const c10::IValue step = require(entry, "step", param_where);
    if (!step.isInt()) {
      throw InvalidArgument(fmt::format("{}: 'step' must be an int, got {}", param_where, step.tagKind()));
    }
    std::array<at::Tensor, detail::kSlotCount> loaded;
    for (const auto& field : entry) {
      const std::string& key = field.key().toStringRef();
      if (key == "step") continue;
      const int slot = detail::slot_of(key);
      if (slot < 0 || !detail::family_has_slot(family_, slot)) {
        throw InvalidArgument(
            fmt::format("{}: unexpected entry '{}' for {}", param_where, key, detail::family_name(family_)));
      }
      const c10::IValue& value = field.value();
      if (!value.isTensor() || !value.toTensor().defined() || value.toTensor().sizes() != param.sizes() ||
          !at::isFloatingType(value.toTensor().scalar_type())) {
        throw InvalidArgument(fmt::format("{}.{}: expected a floating-point tensor of shape [{}], got {}", param_where,
                                          key, fmt::join(param.sizes(), ", "),
                                          value.isTensor() && value.toTensor().defined()
                                              ? describe(value.toTensor())
                                              : std::string(value.tagKind())));
      }
      loaded[slot] = value.toTensor();
    }
    const bool amsgrad = options[group_of[index]].amsgrad;
    for (int slot : {detail::kExpAvgSlot, detail::kExpAvgSqSlot, detail::kMaxExpAvgSqSlot}) {
      if (!loaded[slot].defined() && (slot != detail::kMaxExpAvgSqSlot || amsgrad)) {
        throw InvalidArgument(fmt::format("{}: missing entry '{}'", param_where, detail::slot_name(slot)));
      }
    }
    const bool master_from_param = family_ == Family::kMasterAdamW && !loaded[detail::kMasterParamSlot].defined();
    if (master_from_param) {
      // A checkpoint of an optimizer without masters: the parameter is the master.
      loaded[detail::kMasterParamSlot] = param.detach();
    }

    auto fresh = detail::new_param_state(family_);
    detail::ParamStateRef ref = detail::state_ref(family_, *fresh);
    *ref.step = step.toInt();
    const c10::ScalarType dtype = family_ == Family::kMasterAdamW ? at::kFloat : param.scalar_type();
    for (int slot = 0; slot < detail::kSlotCount; ++slot) {
      if (!loaded[slot].defined()) continue;
      const bool swapped = swapped_slot_[slot] && param.numel() >= config_.min_numel() && at::isFloatingType(dtype);
      if (!swapped) {
        *ref.tensors[slot] = loaded[slot].to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true);
        continue;
      }
      SlotRequest request;
      request.param = param.unsafeGetTensorImpl();
      request.slot = slot;
      request.holder = ref.tensors[slot];
      request.shape = param.sizes().vec();
      request.dtype = dtype;
      // A master taken from the parameter comes from the device; checkpoint tensors are
      // copied (and cast) into the host buffers on the CPU.
      const bool from_param = master_from_param && slot == detail::kMasterParamSlot;
      request.source = from_param ? Source::kDeviceCopy : Source::kHostCopy;
      request.from = loaded[slot];
      requests_by_param[index].push_back(std::move(request));
    }
    new_states[index] = std::move(fresh);
  }

  // Apply. No copy may still be writing the old host buffers when they are dropped.
  engine_->synchronize(host_ready_);
  auto& states = optimizer_->state();
  states.clear();
  std::vector<SlotRequest> requests;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!new_states[i]) continue;
    states[detail::state_key(states, params[i])] = std::move(new_states[i]);
    for (SlotRequest& request : requests_by_param[i]) requests.push_back(std::move(request));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    apply_options(family_, options[g], param_groups[g].options());
  }
  ensure_host_layout(std::move(requests));
}

}  // namespace stowage::optim
