#pragma once

// Uniform access to the per-parameter state of the Adam-family optimizers the swap
// optimizer wraps (torch::optim::Adam, torch::optim::AdamW, stowage::optim::MasterAdamW).

#include <torch/optim/optimizer.h>

#include <array>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>

namespace stowage::optim::detail {

enum class Family { kAdam, kAdamW, kMasterAdamW };

// Throws stowage::InvalidArgument for any other optimizer type.
Family family_of(const torch::optim::Optimizer& optimizer);
const char* family_name(Family family);

// The tensor states, in the order the swap optimizer lays them out.
enum StateSlot : int { kExpAvgSlot = 0, kExpAvgSqSlot, kMaxExpAvgSqSlot, kMasterParamSlot, kSlotCount };
const char* slot_name(int slot);
// -1 for a name that is no state.
int slot_of(const std::string& name);
// Whether the family keeps this state at all.
bool family_has_slot(Family family, int slot);

// References into one parameter's state object.
struct ParamStateRef {
  int64_t* step = nullptr;
  std::array<at::Tensor*, kSlotCount> tensors{};  // null where the family has no such state
};
ParamStateRef state_ref(Family family, torch::optim::OptimizerParamState& state);
std::unique_ptr<torch::optim::OptimizerParamState> new_param_state(Family family);

// LibTorch keys optimizer state by the parameter's TensorImpl: a pointer string in 1.13,
// the pointer itself in 2.x. The key type is read off the map, so both build.
template <typename StateMap>
typename StateMap::key_type state_key(const StateMap&, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  c10::TensorImpl* impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // the format c10::guts::to_string uses
    out << impl;
    return out.str();
  } else {
    return static_cast<Key>(impl);
  }
}

// The parameter's state object, or null.
template <typename StateMap>
torch::optim::OptimizerParamState* find_state(StateMap& states, const at::Tensor& param) {
  const auto it = states.find(state_key(states, param));
  return it == states.end() ? nullptr : it->second.get();
}

}  // namespace stowage::optim::detail
