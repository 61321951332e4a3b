// The swap optimizer's update on the host (SwapOptimizerConfig::update_on_host): on the
// test device (the simulated one in a wheel build, else the CPU) its parameters and
// states are bit for bit those of FusedAdamW (and MasterAdamW) stepping host copies, a
// fraction offloaded splits them with the swap's device update, a checkpoint resumes bit
// for bit, a parameter changed between steps is read again, and it moves at most half
// the swap's bytes a step.

#include <stowage/error.h>
#include <stowage/optim/fused_adamw.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_optimizer.h>

#include "optim/swap_test_util.h"
#include "test_device.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace stowage::optim {
namespace {

using ::testing::HasSubstr;

const testing::Shapes kHostUpdateShapes = {{testing::kSwappedNumel * 2}, {64, 40}, {testing::kSwappedNumel}, {48, 64}};

std::vector<torch::Tensor> on_test_device(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.detach().to(stowage::testing::test_device()).requires_grad_());
  return out;
}

// The same gradients as testing::set_grads gives host copies, on the parameters' device.
void set_host_update_grads(std::vector<torch::Tensor>& params, int step) {
  std::vector<torch::Tensor> host;
  host.reserve(params.size());
  for (const auto& p : params) host.push_back(p.detach().cpu());
  testing::set_grads(host, step);
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = host[i].grad().to(params[i].device());
}

void expect_host_update_params_equal(const std::vector<torch::Tensor>& device, const std::vector<torch::Tensor>& host) {
  ASSERT_EQ(device.size(), host.size());
  for (size_t i = 0; i < device.size(); ++i) {
    EXPECT_TRUE(torch::equal(device[i].detach().cpu(), host[i].detach())) << "parameter " << i;
  }
}

SwapOptimizerConfig host_update_config(double fraction = 1.0) {
  return SwapOptimizerConfig().swap_times(2).update_on_host(true).offload_fraction(fraction);
}

const auto kHostUpdateOptions = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);

// Steps `optimizer` (over `params`, on the test device) and `reference` (over host copies
// of them) alike, then compares parameters and states exactly.
void expect_host_update_matches(SwapOptimizer& optimizer, std::vector<torch::Tensor>& params,
                                const std::shared_ptr<torch::optim::Optimizer>& reference,
                                std::vector<torch::Tensor>& reference_params) {
  for (int step = 0; step < 4; ++step) {
    set_host_update_grads(params, step);
    testing::set_grads(reference_params, step);
    optimizer.step();
    reference->step();
  }
  expect_host_update_params_equal(params, reference_params);
  testing::expect_state_dicts_equal(testing::plain_state_dict(reference), optimizer.state_dict());
  EXPECT_EQ(optimizer.resident_state_bytes(), 0);
}

TEST(HostUpdate, AdamWOnTheHostIsFusedAdamWBitForBitWithAdamWsState) {
  const auto host_params = testing::make_params(kHostUpdateShapes);
  auto params = on_test_device(host_params);
  auto reference_params = testing::clone_params(host_params);
  auto optimizer = swap_optimizer(testing::adamw(params, kHostUpdateOptions), host_update_config());
  expect_host_update_matches(*optimizer, params, std::make_shared<FusedAdamW>(reference_params, kHostUpdateOptions),
                             reference_params);
}

TEST(HostUpdate, MasterAdamWOnTheHostMatchesMasterAdamWOnHostCopies) {
  const auto host_params = testing::make_params(kHostUpdateShapes, torch::kBFloat16);
  auto params = on_test_device(host_params);
  auto reference_params = testing::clone_params(host_params);
  auto optimizer = swap_optimizer(std::make_shared<MasterAdamW>(params, kHostUpdateOptions), host_update_config());
  expect_host_update_matches(*optimizer, params, std::make_shared<MasterAdamW>(reference_params, kHostUpdateOptions),
                             reference_params);
}

// The first half of the bytes on the host (FusedAdamW's pass), the rest through the
// swap's batches (LibTorch's AdamW operations).
TEST(HostUpdate, HalfOffloadedSplitsTheParametersByBytes) {
  const testing::Shapes shapes(4, {testing::kSwappedNumel});
  const auto host_params = testing::make_params(shapes);
  auto params = on_test_device(host_params);
  auto reference_params = testing::clone_params(host_params);
  auto fused = std::make_shared<FusedAdamW>(
      std::vector<torch::Tensor>(reference_params.begin(), reference_params.begin() + 2), kHostUpdateOptions);
  auto plain = testing::adamw({reference_params.begin() + 2, reference_params.end()}, kHostUpdateOptions);
  auto optimizer = swap_optimizer(testing::adamw(params, kHostUpdateOptions), host_update_config(0.5));
  for (int step = 0; step < 4; ++step) {
    set_host_update_grads(params, step);
    testing::set_grads(reference_params, step);
    optimizer->step();
    fused->step();
    plain->step();
  }
  expect_host_update_params_equal(params, reference_params);
}

TEST(HostUpdate, ACheckpointResumesBitForBit) {
  const auto host_params = testing::make_params(kHostUpdateShapes);
  auto straight_params = on_test_device(host_params);
  auto straight = swap_optimizer(testing::adamw(straight_params, kHostUpdateOptions), host_update_config(0.5));
  auto first_params = on_test_device(host_params);
  auto first = swap_optimizer(testing::adamw(first_params, kHostUpdateOptions), host_update_config(0.5));
  for (int step = 0; step < 3; ++step) {
    set_host_update_grads(straight_params, step);
    set_host_update_grads(first_params, step);
    straight->step();
    first->step();
  }
  // The resumed run's parameters are made afresh and loaded in place, as a model's are.
  auto resumed_params = on_test_device(testing::make_params(kHostUpdateShapes, torch::kFloat, /*seed=*/99));
  auto resumed = swap_optimizer(testing::adamw(resumed_params, kHostUpdateOptions), host_update_config(0.5));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < resumed_params.size(); ++i) resumed_params[i].copy_(first_params[i]);
  }
  resumed->load_state_dict(first->state_dict());
  for (int step = 3; step < 6; ++step) {
    set_host_update_grads(straight_params, step);
    set_host_update_grads(resumed_params, step);
    straight->step();
    resumed->step();
  }
  expect_host_update_params_equal(resumed_params, [&] {
    std::vector<torch::Tensor> cpu;
    cpu.reserve(straight_params.size());
    for (const auto& p : straight_params) cpu.push_back(p.detach().cpu());
    return cpu;
  }());
  testing::expect_state_dicts_equal(straight->state_dict(), resumed->state_dict());
}

// The host's copy of a parameter is read again once the parameter changed on the device.
TEST(HostUpdate, AParameterChangedBetweenStepsIsReadAgain) {
  const auto host_params = testing::make_params(kHostUpdateShapes);
  auto params = on_test_device(host_params);
  auto reference_params = testing::clone_params(host_params);
  auto reference = std::make_shared<FusedAdamW>(reference_params, kHostUpdateOptions);
  auto optimizer = swap_optimizer(testing::adamw(params, kHostUpdateOptions), host_update_config());
  for (int step = 0; step < 3; ++step) {
    if (step == 2) {
      torch::NoGradGuard no_grad;
      for (auto& p : params) p.mul_(0.5);
      for (auto& p : reference_params) p.mul_(0.5);
    }
    set_host_update_grads(params, step);
    testing::set_grads(reference_params, step);
    optimizer->step();
    reference->step();
  }
  expect_host_update_params_equal(params, reference_params);
}

// fp32 AdamW: the swap moves m and v up and down (16 bytes a parameter), the host update
// the gradient down and the parameter up (8).
TEST(HostUpdate, MovesAtMostHalfTheSwapsBytesAStep) {
  if (stowage::testing::test_device().is_cpu()) GTEST_SKIP() << "on the CPU nothing is copied";
  const testing::Shapes shapes(4, {testing::kSwappedNumel});
  auto host_update_params = on_test_device(testing::make_params(shapes));
  auto swapped_params = on_test_device(testing::make_params(shapes));
  auto host_update = swap_optimizer(testing::adamw(host_update_params), host_update_config());
  auto swapped = swap_optimizer(testing::adamw(swapped_params), SwapOptimizerConfig().swap_times(2));
  const auto bytes_of_one_step = [](SwapOptimizer& optimizer, std::vector<torch::Tensor>& params, int step) {
    set_host_update_grads(params, step);
    const memory::CopyStats before = optimizer.copy_stats();
    optimizer.step();
    const memory::CopyStats after = optimizer.copy_stats();
    return after.h2d_bytes + after.d2h_bytes - before.h2d_bytes - before.d2h_bytes;
  };
  bytes_of_one_step(*host_update, host_update_params, 0);  // the first step reads the parameters
  bytes_of_one_step(*swapped, swapped_params, 0);
  const int64_t host_bytes = bytes_of_one_step(*host_update, host_update_params, 1);
  const int64_t swap_bytes = bytes_of_one_step(*swapped, swapped_params, 1);
  EXPECT_EQ(host_bytes, 4 * testing::kSwappedNumel * 8);
  EXPECT_EQ(swap_bytes, 4 * testing::kSwappedNumel * 16);
}

TEST(HostUpdate, BadOptionsAreRefusedByName) {
  for (const double bad : {-0.25, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    try {
      SwapOptimizerConfig().update_on_host(true).offload_fraction(bad).validate();
      FAIL() << "offload_fraction " << bad << " was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("offload_fraction must be in [0, 1], got " + fmt::format("{}", bad)));
    }
  }
  EXPECT_THROW(SwapOptimizerConfig().offload_fraction(0.5).validate(), InvalidArgument);
  try {
    SwapOptimizerConfig().update_on_host(true).state_keys({kExpAvg}).validate();
    FAIL() << "state_keys were taken with update_on_host";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("update_on_host keeps every state on the host, but state_keys lists [exp_avg]"));
  }
  try {
    SwapOptimizerConfig().update_on_host(true).swap_dir("/tmp").validate();
    FAIL() << "swap_dir was taken with update_on_host";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("swap_dir '/tmp'"));
  }
}

}  // namespace
}  // namespace stowage::optim
