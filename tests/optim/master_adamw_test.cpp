// MasterAdamW through stowage::OptimizerState, which finds it in the optimizer adapter
// registry: its state dict has fp32 moments and masters, and a resumed run continues bit
// for bit.

#include <stowage/optim/master_adamw.h>
#include <stowage/state/copy.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/stateful.h>

#include "optim/swap_test_util.h"

namespace stowage::optim {
namespace {

using testing::clone_params;
using testing::make_params;
using testing::set_grads;

const testing::Shapes kMasterShapes = {{300}, {20, 30}, {7}};

void master_adamw_steps(MasterAdamW& optimizer, std::vector<torch::Tensor>& params, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_grads(params, step);
    optimizer.step();
  }
}

std::shared_ptr<MasterAdamW> make_master_adamw(const std::vector<torch::Tensor>& params) {
  return std::make_shared<MasterAdamW>(params, torch::optim::AdamWOptions(1e-2).amsgrad(true).weight_decay(0.05));
}

TEST(MasterAdamWState, OptimizerStateSavesFp32MomentsAndMasters) {
  auto params = make_params(kMasterShapes, torch::kBFloat16);
  auto optimizer = make_master_adamw(params);
  master_adamw_steps(*optimizer, params, 0, 2);
  EXPECT_EQ(&optimizer_adapter(*optimizer, "test"), &master_adamw_adapter());

  const StateDict state = OptimizerState(optimizer).state_dict();
  const auto entries = state.at("state").toGenericDict();
  ASSERT_EQ(entries.size(), kMasterShapes.size());
  for (const auto& item : entries) {
    const auto fields = item.value().toGenericDict();
    EXPECT_EQ(fields.at("step").toInt(), 2) << item.key().toStringRef();
    for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param"}) {
      ASSERT_TRUE(fields.contains(key)) << item.key().toStringRef() << "." << key;
      EXPECT_EQ(fields.at(key).toTensor().scalar_type(), torch::kFloat) << item.key().toStringRef() << "." << key;
    }
  }
  // The master is the parameter before rounding: equal to it once rounded.
  const at::Tensor master = entries.at("1").toGenericDict().at("master_param").toTensor();
  EXPECT_TRUE(torch::equal(master.to(torch::kBFloat16), params[1]));
  EXPECT_EQ(state.at("param_groups").toList().get(0).toGenericDict().at("weight_decay").toDouble(), 0.05);
}

TEST(MasterAdamWState, AResumedRunContinuesBitForBit) {
  auto params = make_params(kMasterShapes, torch::kBFloat16);
  auto optimizer = make_master_adamw(params);
  master_adamw_steps(*optimizer, params, 0, 3);
  const StateDict live = OptimizerState(optimizer).state_dict();
  StateDict saved = create_cpu_state_dict(live);
  copy_state_dict(live, saved);
  auto resumed_params = clone_params(params);
  master_adamw_steps(*optimizer, params, 3, 6);  // the uninterrupted run

  auto resumed = make_master_adamw(resumed_params);
  OptimizerState(resumed).load_state_dict(saved);
  master_adamw_steps(*resumed, resumed_params, 3, 6);
  testing::expect_params_equal(params, resumed_params);
  testing::expect_state_dicts_equal(OptimizerState(optimizer).state_dict(), OptimizerState(resumed).state_dict());
}

TEST(MasterAdamWState, ALoadedStateIsKeptInFp32WhateverItsSavedDtype) {
  auto params = make_params(kMasterShapes, torch::kBFloat16);
  auto optimizer = make_master_adamw(params);
  master_adamw_steps(*optimizer, params, 0, 1);
  StateDict saved = OptimizerState(optimizer).state_dict();
  for (const auto& item : saved.at("state").toGenericDict()) {
    auto fields = item.value().toGenericDict();
    for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param"}) {
      fields.insert_or_assign(key, fields.at(key).toTensor().to(torch::kDouble));
    }
  }
  auto restored = make_master_adamw(clone_params(params));
  OptimizerState(restored).load_state_dict(saved);
  for (const auto& item : OptimizerState(restored).state_dict().at("state").toGenericDict()) {
    const auto fields = item.value().toGenericDict();
    for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param"}) {
      EXPECT_EQ(fields.at(key).toTensor().scalar_type(), torch::kFloat) << item.key().toStringRef() << "." << key;
    }
  }
}

}  // namespace
}  // namespace stowage::optim
