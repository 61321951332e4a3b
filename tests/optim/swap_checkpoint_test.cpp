// The swap optimizer's state dict: round trips, both directions with the plain optimizer,
// dtype casts, no device copies, and clear errors that change nothing.

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include "optim/swap_test_util.h"
#include "test_device.h"

#include <gmock/gmock.h>

#include <cstdlib>
#include <filesystem>

#include <unistd.h>

namespace stowage::optim {
namespace {

using testing::clone_params;
using testing::make_params;
using testing::set_grads;

const testing::Shapes kSavedShapes = {{3000}, {40, 50}, {100}, {2048}, {64, 33}};

std::shared_ptr<torch::optim::Optimizer> amsgrad_adamw(const std::vector<torch::Tensor>& params) {
  return testing::adamw(params, torch::optim::AdamWOptions(1e-2).amsgrad(true));
}

void train(const std::function<void()>& step, std::vector<torch::Tensor>& params, int from, int to) {
  for (int s = from; s < to; ++s) {
    set_grads(params, s);
    step();
  }
}

// A deep copy of a state dict with every state tensor converted to `dtype`.
StateDict converted(const StateDict& sd, torch::Dtype dtype) {
  auto per_param = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : sd.at("state").toGenericDict()) {
    auto entry = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& field : item.value().toGenericDict()) {
      entry.insert(field.key(),
                   field.value().isTensor() ? c10::IValue(field.value().toTensor().to(dtype)) : field.value());
    }
    per_param.insert(item.key(), entry);
  }
  StateDict out;
  out.insert("state", per_param);
  out.insert("param_groups", sd.at("param_groups"));
  return out;
}

// An AdamW whose param groups hold `sizes` of `params` each, in order.
std::shared_ptr<torch::optim::Optimizer> adamw_in_groups(const std::vector<torch::Tensor>& params,
                                                         const std::vector<size_t>& sizes) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  size_t next = 0;
  for (size_t size : sizes) {
    groups.emplace_back(std::vector<torch::Tensor>(params.begin() + next, params.begin() + next + size),
                        std::make_unique<torch::optim::AdamWOptions>(1e-2));
    next += size;
  }
  return std::make_shared<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(1e-2));
}

StateDict checkpoint_state(const std::vector<torch::Tensor>& params, const c10::intrusive_ptr<SwapOptimizer>& swap,
                           int64_t step) {
  StateDict state;
  for (size_t i = 0; i < params.size(); ++i) state.insert("p" + std::to_string(i), params[i].detach());
  state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(swap)));
  state.insert("step", step);
  return state;
}

class SwapCheckpoint : public ::testing::TestWithParam<testing::SwapMode> {
 protected:
  SwapOptimizerConfig config() const { return GetParam().apply(SwapOptimizerConfig().swap_times(3)); }
};

TEST_P(SwapCheckpoint, RoundTripWithoutDeviceCopies) {
  auto params = make_params(kSavedShapes);
  auto swap = swap_optimizer(amsgrad_adamw(params), config());
  train([&] { swap->step(); }, params, 0, 3);

  const memory::CopyStats before_save = swap->copy_stats();
  const StateDict saved = swap->state_dict();
  const memory::CopyStats after_save = swap->copy_stats();
  EXPECT_EQ(after_save.h2d_copies, before_save.h2d_copies);
  EXPECT_EQ(after_save.d2h_copies, before_save.d2h_copies);
  for (const auto& item : saved.at("state").toGenericDict()) {
    EXPECT_TRUE(item.value().toGenericDict().at("exp_avg").toTensor().is_cpu());
  }

  auto restored_params = clone_params(params);
  auto restored = swap_optimizer(amsgrad_adamw(restored_params), config());
  restored->load_state_dict(saved);
  EXPECT_EQ(restored->copy_stats().h2d_copies, 0);
  EXPECT_EQ(restored->copy_stats().d2h_copies, 0);
  testing::expect_state_dicts_equal(saved, restored->state_dict());

  // Four swapped parameters ({100} is below min_numel) in three batches.
  set_grads(restored_params, 3);
  restored->step();
  EXPECT_EQ(restored->copy_stats().h2d_copies, GetParam().packed ? 3 : 4 * 3);
  EXPECT_EQ(restored->copy_stats().d2h_copies, GetParam().packed ? 3 : 4 * 3);

  set_grads(params, 3);
  swap->step();
  train([&] { swap->step(); }, params, 4, 6);
  train([&] { restored->step(); }, restored_params, 4, 6);
  testing::expect_params_equal(params, restored_params);
  testing::expect_state_dicts_equal(swap->state_dict(), restored->state_dict());
}

TEST_P(SwapCheckpoint, LoadsACheckpointOfThePlainOptimizer) {
  auto plain_params = make_params(kSavedShapes);
  auto plain = amsgrad_adamw(plain_params);
  train([&] { plain->step(); }, plain_params, 0, 3);

  auto swap_params = clone_params(plain_params);
  auto swap = swap_optimizer(amsgrad_adamw(swap_params), config());
  swap->load_state_dict(testing::plain_state_dict(plain));
  train([&] { plain->step(); }, plain_params, 3, 6);
  train([&] { swap->step(); }, swap_params, 3, 6);
  testing::expect_params_equal(plain_params, swap_params);
  testing::expect_state_dicts_equal(testing::plain_state_dict(plain), swap->state_dict());
}

TEST_P(SwapCheckpoint, ThePlainOptimizerLoadsItsCheckpoint) {
  auto swap_params = make_params(kSavedShapes);
  auto swap = swap_optimizer(amsgrad_adamw(swap_params), config());
  train([&] { swap->step(); }, swap_params, 0, 3);

  auto plain_params = clone_params(swap_params);
  auto plain = amsgrad_adamw(plain_params);
  OptimizerState(plain).load_state_dict(swap->state_dict());
  train([&] { plain->step(); }, plain_params, 3, 6);
  train([&] { swap->step(); }, swap_params, 3, 6);
  testing::expect_params_equal(plain_params, swap_params);
  testing::expect_state_dicts_equal(testing::plain_state_dict(plain), swap->state_dict());
}

TEST_P(SwapCheckpoint, CastsStatesToTheParameterDtypeOnLoad) {
  auto params = make_params(kSavedShapes);
  auto swap = swap_optimizer(amsgrad_adamw(params), config());
  train([&] { swap->step(); }, params, 0, 2);
  const StateDict saved = swap->state_dict();
  const StateDict as_double = converted(saved, torch::kDouble);
  // deep copies: `saved` aliases the live host buffers
  const StateDict expected = converted(saved, torch::kFloat);

  auto other = swap_optimizer(amsgrad_adamw(clone_params(params)), config());
  other->load_state_dict(as_double);
  testing::expect_state_dicts_equal(expected, other->state_dict());
}

TEST_P(SwapCheckpoint, ABadCheckpointIsRejectedAndChangesNothing) {
  auto params = make_params(kSavedShapes);
  auto swap = swap_optimizer(amsgrad_adamw(params), config());
  train([&] { swap->step(); }, params, 0, 2);
  const StateDict before = converted(swap->state_dict(), torch::kFloat);

  auto with_entry = [&](const std::string& id, const std::string& key, c10::IValue value) {
    StateDict sd = converted(before, torch::kFloat);
    sd.at("state").toGenericDict().at(id).toGenericDict().insert_or_assign(key, std::move(value));
    return sd;
  };
  auto expect_rejected = [&](const StateDict& sd, const std::string& message) {
    try {
      swap->load_state_dict(sd);
      FAIL() << "expected InvalidArgument containing: " << message;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
    }
    testing::expect_state_dicts_equal(before, swap->state_dict());
  };
  expect_rejected(with_entry("1", "exp_avg", torch::zeros({7})), "state.1.exp_avg: expected a floating-point tensor");
  expect_rejected(with_entry("0", "momentum_buffer", torch::zeros({3000})),
                  "state.0: unexpected entry 'momentum_buffer' for torch::optim::AdamW");
  expect_rejected(with_entry("0", "step", c10::IValue(1.5)), "state.0: 'step' must be an int");
  StateDict missing = converted(before, torch::kFloat);
  ASSERT_EQ(missing.at("state").toGenericDict().at("3").toGenericDict().erase("max_exp_avg_sq"), 1u);
  expect_rejected(missing, "state.3: missing entry 'max_exp_avg_sq'");
  StateDict bad_id = converted(before, torch::kFloat);
  bad_id.at("state").toGenericDict().insert("9", bad_id.at("state").toGenericDict().at("0"));
  expect_rejected(bad_id, "state.9: there are only 5 parameters");
}

TEST_P(SwapCheckpoint, ADcpLoadWithOtherParamGroupsFailsBeforeAnythingChanges) {
  auto params = make_params(kSavedShapes);
  auto swap = swap_optimizer(adamw_in_groups(params, {2, 3}), config());
  train([&] { swap->step(); }, params, 0, 2);
  const char* base = std::getenv("TMPDIR");
  const std::string dir = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/stowage-swap-groups-" +
                          std::to_string(::getpid()) + "-" + GetParam().name;
  dcp::save(checkpoint_state(params, swap, 3), dir);

  for (const std::vector<size_t>& groups : {std::vector<size_t>{5}, std::vector<size_t>{3, 2}}) {
    auto fresh_params = make_params(kSavedShapes, torch::kFloat, /*seed=*/11);
    const auto before = clone_params(fresh_params);
    auto fresh = swap_optimizer(adamw_in_groups(fresh_params, groups), config());
    StateDict target = checkpoint_state(fresh_params, fresh, 0);
    try {
      dcp::load(target, dir);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("'optim'"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("SwapOptimizer load_state_dict"));
    }
    testing::expect_params_equal(before, fresh_params);
    EXPECT_EQ(target.at("step").toInt(), 0);
    EXPECT_EQ(fresh->state_dict().at("state").toGenericDict().size(), 0u);
  }
  std::filesystem::remove_all(dir);
}

// A scratch directory for a checkpoint of this test process, removed by the caller.
std::string checkpoint_dir(const std::string& name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/stowage-swap-" + name + "-" +
         std::to_string(::getpid());
}

// Every tensor of an optimizer state dict copied to the CPU: unlike converted(), no alias
// of the live states survives.
StateDict copied(const StateDict& sd) {
  auto per_param = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : sd.at("state").toGenericDict()) {
    auto entry = c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
    for (const auto& field : item.value().toGenericDict()) {
      entry.insert(field.key(),
                   field.value().isTensor() ? c10::IValue(field.value().toTensor().cpu().clone()) : field.value());
    }
    per_param.insert(item.key(), entry);
  }
  StateDict out;
  out.insert("state", per_param);
  out.insert("param_groups", sd.at("param_groups"));
  return out;
}

// The optimizer a SwapOptimizer wraps holds the swap's host buffers as its state, which only
// the swap knows when to read: restored through the optimizer, every state went onto the
// device under the wrapper (out of memory, or the swap's next step blamed the optimizer's own
// step()). as_ivalue(optimizer) refuses it, for a restore and a save, naming the fix.
TEST_P(SwapCheckpoint, TheWrappedOptimizerIsRefusedBeforeAnythingChanges) {
  const c10::Device device = stowage::testing::test_device();
  std::vector<torch::Tensor> params;
  for (const auto& p : make_params(kSavedShapes)) params.push_back(p.detach().to(device).requires_grad_());
  auto inner = amsgrad_adamw(params);
  auto swap = swap_optimizer(inner, config());
  const auto step = [&](int s) {
    set_grads(params, s);
    for (auto& p : params) p.mutable_grad() = p.grad().to(device);
    swap->step();
  };
  step(0);
  step(1);
  const std::string dir = checkpoint_dir("wrapped-" + GetParam().name);
  dcp::save(checkpoint_state(params, swap, 2), dir);
  step(2);  // the live state is past the checkpoint's

  memory::enable_accounting();
  const auto params_before = clone_params(params);
  const StateDict state_before = copied(swap->state_dict());
  const int64_t device_bytes = memory::memory_allocated(device);
  const std::string refusal =
      "OptimizerState: this torch::optim::AdamW is wrapped by a live SwapOptimizer, which keeps its state; pass the "
      "SwapOptimizer to save and restore, not the optimizer it wraps";
  try {
    StateDict target;
    for (size_t i = 0; i < params.size(); ++i) target.insert("p" + std::to_string(i), params[i].detach());
    target.insert("optim", as_ivalue(inner));
    target.insert("step", int64_t{0});
    dcp::load(target, dir);
    ADD_FAILURE() << "restored into the optimizer a SwapOptimizer wraps";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(refusal));
  }
  EXPECT_EQ(memory::memory_allocated(device), device_bytes);
  testing::expect_params_equal(params_before, params);
  testing::expect_state_dicts_equal(state_before, swap->state_dict());

  const std::string unsaved = checkpoint_dir("wrapped-save-" + GetParam().name);
  try {
    StateDict state;
    state.insert("optim", as_ivalue(inner));
    dcp::save(state, unsaved);
    ADD_FAILURE() << "saved the optimizer a SwapOptimizer wraps";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(refusal));
  }
  EXPECT_FALSE(std::filesystem::exists(unsaved));

  // Through the swap, the same checkpoint restores, and steps go on.
  StateDict target = checkpoint_state(params, swap, 0);
  dcp::load(target, dir);
  EXPECT_EQ(target.at("step").toInt(), 2);
  step(2);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, SwapCheckpoint, ::testing::ValuesIn(testing::swap_modes()), testing::mode_name);

TEST(SwapCheckpointMasters, MasterWeightsRoundTripAndComeFromTheParameterWhenAbsent) {
  const SwapOptimizerConfig config = SwapOptimizerConfig().swap_times(2).include_master_params(true);
  auto params = make_params(kSavedShapes, torch::kBFloat16);
  auto swap = swap_optimizer(std::make_shared<MasterAdamW>(params), config);
  train([&] { swap->step(); }, params, 0, 3);
  const StateDict saved = swap->state_dict();
  auto restored_params = clone_params(params);
  auto restored = swap_optimizer(std::make_shared<MasterAdamW>(restored_params), config);
  restored->load_state_dict(saved);
  testing::expect_state_dicts_equal(saved, restored->state_dict());

  // A checkpoint without masters (e.g. of a plain AdamW): the masters are the parameters.
  StateDict without_masters = converted(saved, torch::kFloat);
  for (const auto& item : without_masters.at("state").toGenericDict()) {
    EXPECT_EQ(item.value().toGenericDict().erase("master_param"), 1u) << item.key().toStringRef();
  }
  restored->load_state_dict(without_masters);
  const auto state = restored->state_dict().at("state").toGenericDict();
  EXPECT_TRUE(torch::equal(state.at("0").toGenericDict().at("master_param").toTensor(),
                           restored_params[0].detach().to(torch::kFloat)));
}

}  // namespace
}  // namespace stowage::optim
