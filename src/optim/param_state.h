#pragma once

// The swap optimizer's view of the per-parameter state of the Adam-family optimizers it
// wraps (torch::optim::Adam, torch::optim::AdamW, stowage::optim::MasterAdamW), through
// their stowage::OptimizerAdapter.

#include <stowage/state/optimizer_adapter.h>

#include "state/optimizer_state_key.h"

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// One state tensor of a parameter (its exp_avg, exp_avg_sq, max_exp_avg_sq or master
// weight): the one shape the swap gives it, from the wrapped optimizer's state object
// through the step's batches to the host layout.
struct StateTensor {
  int slot = 0;                  // StateSlot
  at::Tensor* holder = nullptr;  // the tensor inside the wrapped optimizer's state object
  // Whether *holder is its host tensor in the swap's host layout (set against the layout;
  // false as param_state() reads it).
  bool swapped = false;
};

// One parameter's state object, as the swap reads and writes it.
struct ParamState {
  int64_t* step = nullptr;
  std::vector<StateTensor> tensors;  // the states the optimizer keeps, in slot order

  // The tensor of `slot` in the state object, or null where the optimizer keeps no such state.
  at::Tensor* holder(int slot) const;
};
// References into `state`, an object of the type adapter.new_state() makes.
ParamState param_state(const OptimizerAdapter& adapter, torch::optim::OptimizerParamState& state);

}  // namespace stowage::optim::detail
