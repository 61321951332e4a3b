// The optimizer state resident on the device between steps, counted from the state tensors
// (SwapOptimizer and ZeroRedundancyOptimizer::resident_state_bytes): the unswapped states
// only, and none of what another thread holds, which memory::memory_allocated counts on
// the CPU (a background checkpoint save's collectives hold byte tensors for a while).

#include <stowage/memory/accounting.h>
#include <stowage/optim/zero_redundancy_optimizer.h>

#include "optim/swap_test_util.h"

#include <gtest/gtest.h>

namespace stowage::optim {
namespace {

using testing::make_params;
using testing::set_grads;

// {100} is below SwapOptimizerConfig's default min_numel: its states stay on the device.
const testing::Shapes kShapes = {{3000}, {100}, {2048}, {64, 33}};
constexpr int64_t kUnswappedNumel = 100;

int64_t numel_of(const testing::Shapes& shapes) {
  int64_t numel = 0;
  for (const auto& shape : shapes) numel += c10::multiply_integers(shape);
  return numel;
}

class ResidentState : public ::testing::TestWithParam<testing::SwapMode> {};

TEST_P(ResidentState, TheSwapCountsItsUnswappedStatesOnly) {
  auto params = make_params(kShapes);
  auto swap = swap_optimizer(testing::adamw(params, torch::optim::AdamWOptions(1e-2).amsgrad(true)),
                             GetParam().apply(SwapOptimizerConfig().swap_times(2)));
  EXPECT_EQ(swap->resident_state_bytes(), 0) << "no state before the first step";
  for (int step = 0; step < 2; ++step) {
    set_grads(params, step);
    swap->step();
    // exp_avg, exp_avg_sq and max_exp_avg_sq of the small parameter, in fp32.
    EXPECT_EQ(swap->resident_state_bytes(), 3 * kUnswappedNumel * 4) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ResidentState, ::testing::ValuesIn(testing::swap_modes()), testing::mode_name);

TEST(ResidentStateZero, APlainShareCountsEveryStateAndASwappedOneItsUnswappedStates) {
  auto factory = [](const std::vector<at::Tensor>& share) { return testing::adamw(share); };
  auto params = make_params(kShapes);
  ZeroRedundancyOptimizer plain(params, factory, std::nullopt);
  set_grads(params, 0);
  plain.step();
  EXPECT_EQ(plain.resident_state_bytes(), 2 * numel_of(kShapes) * 4);  // exp_avg, exp_avg_sq

  auto swapped_params = make_params(kShapes);
  ZeroRedundancyOptimizer swapped(swapped_params, factory, std::nullopt,
                                  ZeroRedundancyOptimizerOptions().swap(SwapOptimizerConfig().swap_times(2)));
  set_grads(swapped_params, 0);
  swapped.step();
  EXPECT_EQ(swapped.resident_state_bytes(), 2 * kUnswappedNumel * 4);
}

}  // namespace
}  // namespace stowage::optim
