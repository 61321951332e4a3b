// SwapOptimizer's checkpoint support: the wrapped optimizer's state in
// stowage::OptimizerState's layout, with swapped states handed out and taken in as host
// tensors.

#include <stowage/error.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>

#include "optim/swap_internal.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace stowage::optim {

using detail::describe;
using detail::Source;
using detail::StatePlacement;
using detail::StateTensor;

StateDict SwapOptimizer::Rep::state_dict() {
  check_steps_are_the_wrappers();
  // The caller reads the host buffers on the CPU: the downloads into them must be done.
  engine_->synchronize(host_ready_);
  // The wrapped optimizer's states hold the swapped states' host tensors, so its layout is
  // the swap's (written here, not by an OptimizerState, which refuses a wrapped optimizer).
  return write_adapter_state(*adapter_, *optimizer_);
}

namespace {

// Every check of SwapOptimizer::load_state_dict on a layout read for an optimizer that
// `adapter` serves: returns what applies each group's options.
std::vector<ApplyOptions> check_swap_state(const OptimizerAdapter& adapter, const OptimizerLayout& layout) {
  std::vector<ApplyOptions> apply_options;
  std::vector<bool> amsgrad;
  for (const OptimizerLayout::Group& group : layout.groups) {
    apply_options.push_back(adapter.read_options(group.options, group.where));
    amsgrad.push_back(require_bool(group.options, "amsgrad", group.where));
  }
  for (const OptimizerLayout::Entry& item : layout.entries) {
    const at::Tensor& param = layout.params[item.param];
    require_int(item.fields, "step", item.where);
    std::array<bool, detail::kSlotCount> present{};
    for (const auto& field : item.fields) {
      const std::string& key = field.key().toStringRef();
      if (key == "step") continue;
      const int slot = detail::slot_of(key);
      if (slot < 0 || !detail::has_slot(adapter, slot)) {
        throw InvalidArgument(fmt::format("{}: unexpected entry '{}' for {}", item.where, key, adapter.name()));
      }
      const c10::IValue& value = field.value();
      if (!value.isTensor() || !value.toTensor().defined() || value.toTensor().sizes() != param.sizes() ||
          !at::isFloatingType(value.toTensor().scalar_type())) {
        throw InvalidArgument(fmt::format("{}.{}: expected a floating-point tensor of shape [{}], got {}", item.where,
                                          key, fmt::join(param.sizes(), ", "),
                                          value.isTensor() && value.toTensor().defined()
                                              ? describe(value.toTensor())
                                              : std::string(value.tagKind())));
      }
      present[slot] = true;
    }
    for (int slot : {detail::kExpAvgSlot, detail::kExpAvgSqSlot, detail::kMaxExpAvgSqSlot}) {
      if (!present[slot] && (slot != detail::kMaxExpAvgSqSlot || amsgrad[layout.group_of[item.param]])) {
        throw InvalidArgument(fmt::format("{}: missing entry '{}'", item.where, detail::slot_name(slot)));
      }
    }
  }
  return apply_options;
}

const char* const kLoadWhere = "SwapOptimizer load_state_dict";

}  // namespace

void SwapOptimizer::Rep::check_load_state_dict(const StateDict& state) {
  check_swap_state(*adapter_, read_optimizer_layout(state, *optimizer_, kLoadWhere));
}

std::unique_ptr<torch::optim::OptimizerParamState> SwapOptimizer::Rep::loaded_state(
    const OptimizerLayout::Entry& item, const at::Tensor& param, std::vector<StatePlacement>& placements) const {
  std::array<at::Tensor, detail::kSlotCount> loaded;
  for (const auto& field : item.fields) {
    const std::string& key = field.key().toStringRef();
    if (key != "step") loaded[detail::slot_of(key)] = field.value().toTensor();
  }
  const bool master_from_param =
      detail::has_slot(*adapter_, detail::kMasterParamSlot) && !loaded[detail::kMasterParamSlot].defined();
  if (master_from_param) {
    // A checkpoint of an optimizer without masters: the parameter is the master.
    loaded[detail::kMasterParamSlot] = param.detach();
  }
  auto fresh = adapter_->new_state();
  detail::ParamState state = detail::param_state(*adapter_, *fresh);
  *state.step = item.fields.at("step").toInt();
  const c10::ScalarType dtype = adapter_->state_dtype(param);
  for (const StateTensor& tensor : state.tensors) {
    const at::Tensor& from = loaded[tensor.slot];
    if (!from.defined()) continue;
    const bool swapped =
        swapped_slot_[tensor.slot] && param.numel() >= config_.min_numel() && at::isFloatingType(dtype);
    if (!swapped) {
      *tensor.holder = from.to(param.device(), dtype, /*non_blocking=*/false, /*copy=*/true);
      continue;
    }
    // A master taken from the parameter comes from the device; checkpoint tensors are
    // copied (and cast) into the host buffers on the CPU.
    const bool from_param = master_from_param && tensor.slot == detail::kMasterParamSlot;
    placements.push_back(
        {tensor, param.sizes().vec(), dtype, from_param ? Source::kDeviceCopy : Source::kHostCopy, from});
  }
  return fresh;
}

void SwapOptimizer::Rep::load_state_dict(const StateDict& state) {
  const OptimizerLayout layout = read_optimizer_layout(state, *optimizer_, kLoadWhere);
  const std::vector<at::Tensor>& params = layout.params;
  // Check everything, then build the new states; change nothing until all is built.
  const std::vector<ApplyOptions> apply_options = check_swap_state(*adapter_, layout);
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> new_states(params.size());
  // Sources of the swapped states, by parameter and then slot, the layout's order.
  std::vector<std::vector<StatePlacement>> placements_by_param(params.size());
  for (const OptimizerLayout::Entry& item : layout.entries) {
    new_states[item.param] = loaded_state(item, params[item.param], placements_by_param[item.param]);
  }

  // The host layout first: it is the one part that can still fail (a download of a master
  // taken from its parameter), and it changes nothing when it does. It waits for the copies
  // into the old host buffers, which the old states keep alive until they are dropped.
  std::vector<StatePlacement> placements;
  for (size_t i = 0; i < params.size(); ++i) {
    for (StatePlacement& placement : placements_by_param[i]) placements.push_back(std::move(placement));
  }
  ensure_host_layout(placements);
  auto& states = optimizer_->state();
  states.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (new_states[i]) states[detail::state_key(states, params[i])] = std::move(new_states[i]);
  }
  auto& param_groups = optimizer_->param_groups();
  for (size_t g = 0; g < param_groups.size(); ++g) {
    apply_options[g](param_groups[g].options());
  }
  // Every state is the loaded one now, whatever ran before.
  record_steps();
}

}  // namespace stowage::optim
