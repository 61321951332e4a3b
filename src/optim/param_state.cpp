#include "optim/param_state.h"

#include <stowage/error.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_config.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <c10/util/Type.h>
#include <fmt/format.h>

namespace stowage::optim::detail {
namespace {

template <typename State>
ParamStateRef refs_of(State& state) {
  ParamStateRef ref;
  ref.step = &state.step();
  ref.tensors[kExpAvgSlot] = &state.exp_avg();
  ref.tensors[kExpAvgSqSlot] = &state.exp_avg_sq();
  ref.tensors[kMaxExpAvgSqSlot] = &state.max_exp_avg_sq();
  return ref;
}

}  // namespace

Family family_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return Family::kAdam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return Family::kAdamW;
  if (dynamic_cast<const MasterAdamW*>(&optimizer)) return Family::kMasterAdamW;
  throw InvalidArgument(fmt::format(
      "Swap optimizer only supports torch::optim::Adam, torch::optim::AdamW and stowage::optim::MasterAdamW. Got {}.",
      c10::demangle(typeid(optimizer).name())));
}

const char* family_name(Family family) {
  switch (family) {
    case Family::kAdam:
      return "torch::optim::Adam";
    case Family::kAdamW:
      return "torch::optim::AdamW";
    case Family::kMasterAdamW:
      return "stowage::optim::MasterAdamW";
  }
  return "?";
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

bool family_has_slot(Family family, int slot) {
  return slot != kMasterParamSlot || family == Family::kMasterAdamW;
}

ParamStateRef state_ref(Family family, torch::optim::OptimizerParamState& state) {
  switch (family) {
    case Family::kAdam:
      return refs_of(static_cast<torch::optim::AdamParamState&>(state));
    case Family::kAdamW:
      return refs_of(static_cast<torch::optim::AdamWParamState&>(state));
    case Family::kMasterAdamW: {
      auto& master_state = static_cast<MasterAdamWParamState&>(state);
      ParamStateRef ref = refs_of(master_state);
      ref.tensors[kMasterParamSlot] = &master_state.master_param();
      return ref;
    }
  }
  throw Error("state_ref: unknown optimizer family");
}

std::unique_ptr<torch::optim::OptimizerParamState> new_param_state(Family family) {
  switch (family) {
    case Family::kAdam:
      return std::make_unique<torch::optim::AdamParamState>();
    case Family::kAdamW:
      return std::make_unique<torch::optim::AdamWParamState>();
    case Family::kMasterAdamW:
      return std::make_unique<MasterAdamWParamState>();
  }
  throw Error("new_param_state: unknown optimizer family");
}

}  // namespace stowage::optim::detail
