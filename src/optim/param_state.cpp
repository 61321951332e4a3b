#include "optim/param_state.h"

#include <stowage/error.h>
#include <stowage/optim/fused_adamw.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_config.h>

#include <c10/util/Type.h>
#include <fmt/format.h>

#include <algorithm>

namespace stowage::optim::detail {

SwapTarget swap_target_of(const torch::optim::Optimizer& optimizer) {
  const OptimizerAdapter* adapter = find_optimizer_adapter(optimizer);
  if (adapter == &adam_adapter()) return {adapter, Family::kAdam, false};
  if (adapter == &adamw_adapter()) {
    return {adapter, Family::kAdamW, dynamic_cast<const FusedAdamW*>(&optimizer) != nullptr};
  }
  if (adapter == &master_adamw_adapter()) return {adapter, Family::kMasterAdamW, true};
  throw InvalidArgument(fmt::format(
      "Swap optimizer only supports torch::optim::Adam, torch::optim::AdamW and stowage::optim::MasterAdamW. Got {}.",
      c10::demangle(typeid(optimizer).name())));
}

const char* slot_name(int slot) {
  static const char* names[kSlotCount] = {kExpAvg, kExpAvgSq, kMaxExpAvgSq, kMasterParam};
  return names[slot];
}

int slot_of(const std::string& name) {
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (name == slot_name(slot)) return slot;
  }
  return -1;
}

bool has_slot(const OptimizerAdapter& adapter, int slot) {
  const std::vector<std::string>& keys = adapter.tensor_keys();
  return std::find(keys.begin(), keys.end(), slot_name(slot)) != keys.end();
}

at::Tensor* ParamState::holder(int slot) const {
  for (const StateTensor& tensor : tensors) {
    if (tensor.slot == slot) return tensor.holder;
  }
  return nullptr;
}

ParamState param_state(const OptimizerAdapter& adapter, torch::optim::OptimizerParamState& state) {
  const ParamStateFields fields = adapter.fields(state);
  const std::vector<std::string>& keys = adapter.tensor_keys();
  ParamState param_state;
  param_state.step = fields.step;
  for (size_t i = 0; i < keys.size(); ++i) {
    const int slot = slot_of(keys[i]);
    // swap_target_of admits only adapters whose every state has a slot.
    TORCH_INTERNAL_ASSERT(slot >= 0, adapter.name(), " has a state '", keys[i], "' the swap optimizer has no slot for");
    param_state.tensors.push_back({slot, fields.tensors[i]});
  }
  std::sort(param_state.tensors.begin(), param_state.tensors.end(),
            [](const StateTensor& a, const StateTensor& b) { return a.slot < b.slot; });
  return param_state;
}

}  // namespace stowage::optim::detail
