#pragma once

// The swap optimizer's view of the per-parameter state of the Adam-family optimizers it
// wraps (torch::optim::Adam, torch::optim::AdamW, stowage::optim::MasterAdamW), through
// their stowage::OptimizerAdapter.

#include <stowage/state/optimizer_adapter.h>

#include "state/optimizer_state_key.h"

#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

namespace stowage::optim::detail {

using stowage::detail::find_state;
using stowage::detail::state_key;

// The update the swap optimizer runs: Adam's, AdamW's, or AdamW's on fp32 masters.
enum class Family { kAdam, kAdamW, kMasterAdamW };

// The adapter of an optimizer the swap optimizer can wrap, and its update.
struct SwapTarget {
  const OptimizerAdapter* adapter;
  Family family;
  bool fused_on_host;  // AdamHyperParams::fused_on_host: a FusedAdamW or a MasterAdamW
};
// Throws stowage::InvalidArgument for any other optimizer type.
SwapTarget swap_target_of(const torch::optim::Optimizer& optimizer);

// The tensor states, in the order the swap optimizer lays them out.
enum StateSlot : int { kExpAvgSlot = 0, kExpAvgSqSlot, kMaxExpAvgSqSlot, kMasterParamSlot, kSlotCount };
const char* slot_name(int slot);
// -1 for a name that is no state.
int slot_of(const std::string& name);
// Whether the optimizer keeps this state at all.
bool has_slot(const OptimizerAdapter& adapter, int slot);

// References into one parameter's state object.
struct ParamStateRef {
  int64_t* step = nullptr;
  std::array<at::Tensor*, kSlotCount> tensors{};  // null where the optimizer has no such state
};
ParamStateRef state_ref(const OptimizerAdapter& adapter, torch::optim::OptimizerParamState& state);

}  // namespace stowage::optim::detail
