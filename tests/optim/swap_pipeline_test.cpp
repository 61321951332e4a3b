// What the swap optimizer keeps on the device, what it copies, and the errors it raises.

#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>

#include "optim/param_state.h"
#include "optim/swap_test_util.h"

#include <gmock/gmock.h>

namespace stowage::optim {
namespace {

using testing::adamw;
using testing::clone_params;
using testing::kSwappedNumel;
using testing::make_params;
using testing::set_grads;

constexpr int64_t kStateBytes = kSwappedNumel * 4;  // one fp32 state tensor
const testing::Shapes kEight(8, std::vector<int64_t>{kSwappedNumel});

class SwapPipeline : public ::testing::TestWithParam<testing::SwapMode> {
 protected:
  SwapOptimizerConfig config(int64_t swap_times) const {
    return GetParam().apply(SwapOptimizerConfig().swap_times(swap_times));
  }
};

TEST_P(SwapPipeline, CopiesEachBatchOnceEachWayPerStep) {
  auto params = make_params(kEight);
  auto swap = swap_optimizer(adamw(params), config(3));
  for (int step = 0; step < 3; ++step) {
    set_grads(params, step);
    const memory::CopyStats before = swap->copy_stats();
    swap->step();
    const memory::CopyStats after = swap->copy_stats();
    // Packed: one copy per batch (3 batches, one dtype); per tensor: one per state (8 x 2).
    const int64_t copies = GetParam().packed ? 3 : 16;
    EXPECT_EQ(after.h2d_copies - before.h2d_copies, copies) << "step " << step;
    EXPECT_EQ(after.d2h_copies - before.d2h_copies, copies) << "step " << step;
    EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, 16 * kStateBytes) << "step " << step;
    EXPECT_EQ(after.d2h_bytes - before.d2h_bytes, 16 * kStateBytes) << "step " << step;
  }
}

TEST_P(SwapPipeline, OneCopyPerDtypePerBatchWhenDtypesMix) {
  std::vector<torch::Tensor> params = make_params({{kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}});
  for (size_t i = 1; i < params.size(); i += 2) params[i] = params[i].detach().to(torch::kDouble).requires_grad_();
  auto plain_params = clone_params(params);
  auto swap = swap_optimizer(std::make_shared<torch::optim::Adam>(params), config(2));
  torch::optim::Adam plain(plain_params);
  for (int step = 0; step < 3; ++step) {
    set_grads(params, step);
    set_grads(plain_params, step);
    const memory::CopyStats before = swap->copy_stats();
    swap->step();
    plain.step();
    // Two batches of {fp32, fp64}: packed moves 2 x 2 ranges; per tensor 4 x 2 states.
    EXPECT_EQ(swap->copy_stats().h2d_copies - before.h2d_copies, GetParam().packed ? 4 : 8);
    EXPECT_EQ(swap->copy_stats().d2h_copies - before.d2h_copies, GetParam().packed ? 4 : 8);
  }
  testing::expect_params_equal(plain_params, params);
}

TEST_P(SwapPipeline, BetweenStepsOnlyUnswappedStatesUseDeviceMemory) {
  memory::enable_accounting();
  auto params = make_params(
      {{kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}, {100}});
  set_grads(params, 0);
  const int64_t model_bytes = memory::memory_allocated();
  const int64_t host_before = memory::host_buffer_stats().current_bytes;
  auto swap = swap_optimizer(adamw(params), config(3));
  swap->step();
  // The {100} parameter's two states are below min_numel and stay on the device.
  EXPECT_EQ(memory::memory_allocated() - model_bytes, 2 * 100 * 4);
  EXPECT_GE(memory::host_buffer_stats().current_bytes - host_before, 12 * kStateBytes);
  for (const auto& param : params) {
    auto* state = static_cast<torch::optim::AdamWParamState*>(detail::find_state(swap->optimizer().state(), param));
    EXPECT_TRUE(state->exp_avg().is_cpu());
  }
}

TEST_P(SwapPipeline, AtMostTwoBatchesAreOnTheDeviceAndArenasAreReleased) {
  memory::enable_accounting();
  auto params = make_params(kEight);
  auto swap = swap_optimizer(adamw(params), config(4));  // batches of two parameters
  for (int step = 0; step < 3; ++step) {
    set_grads(params, step);
    const int64_t before = memory::memory_allocated();
    memory::reset_peak_memory_stats();
    swap->step();
    EXPECT_EQ(memory::memory_allocated(), before) << "step " << step;
    const int64_t peak = memory::max_memory_allocated() - before;
    const int64_t batch_state_bytes = 2 * 2 * kStateBytes;
    // Two batches' states, plus the update's one temporary of a parameter's size and a
    // few bytes of 0-dim scalar tensors.
    EXPECT_LE(peak, 2 * batch_state_bytes + kStateBytes + 64) << "step " << step;
    EXPECT_GE(peak, batch_state_bytes) << "step " << step;  // the states did come to the device
  }
}

TEST_P(SwapPipeline, StatesCreatedBeforeWrappingMoveToTheHost) {
  memory::enable_accounting();
  auto params = make_params(kEight);
  auto reference_params = clone_params(params);
  auto inner = adamw(params);
  torch::optim::AdamW reference(reference_params, torch::optim::AdamWOptions(1e-2));
  set_grads(params, 0);
  set_grads(reference_params, 0);
  inner->step();
  reference.step();
  const int64_t before = memory::memory_allocated();
  auto swap = swap_optimizer(inner, config(3));
  EXPECT_EQ(before - memory::memory_allocated(), 16 * kStateBytes);
  EXPECT_EQ(swap->copy_stats().d2h_copies, 16);  // each state downloaded once
  EXPECT_EQ(swap->copy_stats().h2d_copies, 0);
  for (int step = 1; step < 4; ++step) {
    set_grads(params, step);
    set_grads(reference_params, step);
    swap->step();
    reference.step();
  }
  testing::expect_params_equal(reference_params, params);
}

TEST_P(SwapPipeline, ParametersWithoutGradientsKeepTheirState) {
  auto params = make_params(kEight);
  auto reference_params = clone_params(params);
  auto swap = swap_optimizer(adamw(params), config(3));
  torch::optim::AdamW reference(reference_params, torch::optim::AdamWOptions(1e-2));
  auto some = [](size_t i, int step) { return step == 0 ? i % 2 == 0 : i < 6; };
  for (int step = 0; step < 4; ++step) {
    set_grads(params, step, some);
    set_grads(reference_params, step, some);
    swap->step();
    reference.step();
  }
  testing::expect_params_equal(reference_params, params);
  testing::expect_state_dicts_equal(
      OptimizerState(std::shared_ptr<torch::optim::Optimizer>(&reference, [](torch::optim::Optimizer*) {}))
          .state_dict(),
      swap->state_dict());
}

// ---------------------------------------------------------------------- errors

template <typename Fn>
void expect_invalid(Fn&& fn, const std::string& message) {
  try {
    fn();
    FAIL() << "expected InvalidArgument containing: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
  }
}

int64_t step_count(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  auto* state = detail::find_state(optimizer.state(), param);
  return state == nullptr ? 0 : static_cast<torch::optim::AdamWParamState&>(*state).step();
}

// A host tensor is one state's: a state pointed at another state's host tensor is moved
// and updated as a copy of it, not as a second name for it.
TEST_P(SwapPipeline, AStatePointedAtAnothersHostTensorIsUpdatedAsACopy) {
  auto params = make_params({{kSwappedNumel}, {kSwappedNumel}});
  auto reference_params = clone_params(params);
  auto swap = swap_optimizer(adamw(params), config(1));
  torch::optim::AdamW reference(reference_params, torch::optim::AdamWOptions(1e-2));
  set_grads(params, 0);
  set_grads(reference_params, 0);
  swap->step();
  reference.step();
  auto* aliased = static_cast<torch::optim::AdamWParamState*>(detail::find_state(swap->optimizer().state(), params[0]));
  auto* copied =
      static_cast<torch::optim::AdamWParamState*>(detail::find_state(reference.state(), reference_params[0]));
  aliased->exp_avg(aliased->exp_avg_sq());
  copied->exp_avg(copied->exp_avg_sq().clone());
  for (int step = 1; step < 3; ++step) {
    set_grads(params, step);
    set_grads(reference_params, step);
    swap->step();
    reference.step();
    EXPECT_FALSE(aliased->exp_avg().is_same(aliased->exp_avg_sq())) << "step " << step;
    EXPECT_TRUE(torch::equal(aliased->exp_avg(), copied->exp_avg())) << "step " << step;
    EXPECT_TRUE(torch::equal(aliased->exp_avg_sq(), copied->exp_avg_sq())) << "step " << step;
  }
  testing::expect_params_equal(reference_params, params);
}

TEST_P(SwapPipeline, TheWrappedOptimizersOwnStepIsRejectedAtTheWrappersNextStep) {
  auto params = make_params({{kSwappedNumel}, {kSwappedNumel}, {kSwappedNumel}});
  auto inner = adamw(params);
  auto swap = swap_optimizer(inner, config(2));
  set_grads(params, 0, [](size_t i, int) { return i < 2; });
  swap->step();
  // The misuse: parameter 1 is updated (its host states in place), parameter 2 gets states.
  set_grads(params, 1, [](size_t i, int) { return i > 0; });
  inner->step();
  set_grads(params, 2);
  const auto before = clone_params(params);
  expect_invalid([&] { swap->step(); },
                 "parameter 1 of param group 0 is at step 2, but the SwapOptimizer left it at step 1: the wrapped "
                 "optimizer's own step() ran after wrapping, or a state was loaded into it rather than into the "
                 "SwapOptimizer; drive steps and restores through the SwapOptimizer only");
  testing::expect_params_equal(before, params);
  EXPECT_EQ(step_count(*inner, params[0]), 1);
  EXPECT_EQ(step_count(*inner, params[1]), 2);
  EXPECT_EQ(step_count(*inner, params[2]), 1);
  expect_invalid([&] { swap->state_dict(); }, "parameter 1 of param group 0 is at step 2");

  SCOPED_TRACE("a state the wrapped optimizer's step() created");
  auto fresh_params = make_params({{kSwappedNumel}, {kSwappedNumel}});
  auto fresh_inner = adamw(fresh_params);
  auto fresh_swap = swap_optimizer(fresh_inner, config(2));
  set_grads(fresh_params, 0, [](size_t i, int) { return i == 0; });
  fresh_swap->step();
  set_grads(fresh_params, 1, [](size_t i, int) { return i == 1; });
  fresh_inner->step();
  set_grads(fresh_params, 2);
  const auto fresh_before = clone_params(fresh_params);
  expect_invalid([&] { fresh_swap->step(); },
                 "parameter 1 of param group 0 is at step 1, but the SwapOptimizer left it at step 0: the wrapped "
                 "optimizer's own step() ran after wrapping");
  testing::expect_params_equal(fresh_before, fresh_params);
  EXPECT_EQ(step_count(*fresh_inner, fresh_params[0]), 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, SwapPipeline, ::testing::ValuesIn(testing::swap_modes()), testing::mode_name);

TEST(SwapOptimizerErrors, AClosureIsRejected) {
  auto params = make_params(kEight);
  auto swap = swap_optimizer(adamw(params));
  expect_invalid([&] { swap->step([] { return torch::zeros({}); }); }, "does not support a closure");
}

TEST(SwapOptimizerErrors, SparseGradientsAreRejectedBeforeAnyChange) {
  auto params = make_params({{kSwappedNumel}, {kSwappedNumel}});
  auto swap = swap_optimizer(adamw(params));
  set_grads(params, 0);
  params[1].mutable_grad() = torch::zeros({kSwappedNumel}).to_sparse();
  const auto before = params[0].detach().clone();
  expect_invalid([&] { swap->step(); }, "parameter 1 of param group 0 has a sparse gradient");
  EXPECT_TRUE(torch::equal(params[0], before));
  EXPECT_TRUE(swap->optimizer().state().empty());
}

TEST(SwapOptimizerErrors, UnsupportedOptimizersAreNamed) {
  auto params = make_params(kEight);
  expect_invalid([&] { swap_optimizer(std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1))); },
                 "Swap optimizer only supports torch::optim::Adam, torch::optim::AdamW and "
                 "stowage::optim::MasterAdamW. Got torch::optim::SGD.");
}

TEST(SwapOptimizerErrors, StateKeysTheOptimizerDoesNotHave) {
  auto params = make_params(kEight);
  expect_invalid([&] { swap_optimizer(adamw(params), SwapOptimizerConfig().include_master_params(true)); },
                 "Requested state key 'master_param' is not available for torch::optim::AdamW.");
  expect_invalid([&] { swap_optimizer(adamw(params), SwapOptimizerConfig().state_keys({"max_exp_avg_sq"})); },
                 "Requested state key 'max_exp_avg_sq' is not present for any parameter");
  expect_invalid([&] { swap_optimizer(adamw(params), SwapOptimizerConfig().swap_times(-2)); },
                 "SwapOptimizerConfig.swap_times must be positive");
}

TEST(SwapOptimizerErrors, AnOptimizerIsWrappedByOneLiveWrapperAtATime) {
  auto params = make_params(kEight);
  auto reference_params = clone_params(params);
  auto inner = adamw(params);
  auto reference = adamw(reference_params);
  auto first = swap_optimizer(inner);
  const std::string already_wrapped =
      "swap_optimizer: this torch::optim::AdamW is already wrapped by a live SwapOptimizer; wrap an optimizer once "
      "and use that wrapper";
  expect_invalid([&] { swap_optimizer(inner); }, already_wrapped);
  // The refused wrapper neither released the first one's claim nor touched its states.
  set_grads(params, 0);
  set_grads(reference_params, 0);
  first->step();
  reference->step();
  expect_invalid([&] { swap_optimizer(inner); }, already_wrapped);

  first.reset();
  // A constructor that fails for another reason releases its claim too.
  expect_invalid([&] { swap_optimizer(inner, SwapOptimizerConfig().state_keys({"max_exp_avg_sq"})); },
                 "Requested state key 'max_exp_avg_sq' is not present for any parameter");
  auto again = swap_optimizer(inner);  // takes the states over from the first wrapper's host buffers
  set_grads(params, 1);
  set_grads(reference_params, 1);
  again->step();
  reference->step();
  testing::expect_params_equal(reference_params, params);
}

TEST(SwapOptimizer, IsRecognisedInsideAStateDictValue) {
  auto params = make_params(kEight);
  auto inner = adamw(params);
  EXPECT_TRUE(is_swap_optimizer(as_ivalue(c10::intrusive_ptr<Stateful>(swap_optimizer(inner)))));
  EXPECT_FALSE(is_swap_optimizer(as_ivalue(std::shared_ptr<torch::optim::Optimizer>(inner))));
  EXPECT_FALSE(is_swap_optimizer(c10::IValue(3)));
}

}  // namespace
}  // namespace stowage::optim
