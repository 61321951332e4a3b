#include <stowage/error.h>
#include <stowage/optim/partition.h>
#include <stowage/optim/swap_config.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

namespace stowage::optim {
namespace {

std::vector<int64_t> batch_costs(const std::vector<int64_t>& costs, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> out;
  size_t next = 0;
  for (int64_t size : sizes) {
    out.push_back(std::accumulate(costs.begin() + next, costs.begin() + next + size, int64_t{0}));
    next += size;
  }
  return out;
}

TEST(Partition, BalancesTheReferenceExample) {
  const std::vector<int64_t> costs = {16, 16, 16, 16, 16, 1, 16, 16, 4, 2, 4, 2};
  const auto sizes = partition_by_cost(costs, 4);
  EXPECT_EQ(batch_costs(costs, sizes), (std::vector<int64_t>{32, 32, 33, 28}));
}

TEST(Partition, NeverMakesMoreBatchesThanItemsAndNoneEmpty) {
  EXPECT_EQ(partition_by_cost({5, 5, 5}, 16), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(partition_by_cost({100, 1, 1, 1}, 3), (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(partition_by_cost({1, 1, 1, 100}, 3), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(partition_by_cost({7, 7, 7}, 1), (std::vector<int64_t>{3}));
  EXPECT_TRUE(partition_by_cost({}, 4).empty());
}

TEST(Partition, EqualCostsSplitEvenly) {
  const std::vector<int64_t> costs(50, 8);
  const auto sizes = partition_by_cost(costs, 16);
  ASSERT_EQ(sizes.size(), 16u);
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 50);
  for (int64_t size : sizes) {
    EXPECT_GE(size, 3);
    EXPECT_LE(size, 4);
  }
}

TEST(Partition, RejectsNonPositiveParts) {
  EXPECT_THROW(partition_by_cost({1}, 0), InvalidArgument);
}

void expect_config_invalid(const SwapOptimizerConfig& config, const std::string& message) {
  try {
    config.validate();
    FAIL() << "expected InvalidArgument containing: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(message));
  }
}

TEST(SwapOptimizerConfig, DefaultsMatchTheReference) {
  const SwapOptimizerConfig config;
  EXPECT_EQ(config.swap_times(), 16);
  EXPECT_EQ(config.min_numel(), 1024);
  EXPECT_FALSE(config.include_master_params());
  EXPECT_TRUE(config.packed_swap());
  EXPECT_EQ(config.swapped_keys(), (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
  EXPECT_EQ(SwapOptimizerConfig().include_master_params(true).swapped_keys(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "master_param"}));
  EXPECT_EQ(SwapOptimizerConfig().state_keys({"exp_avg_sq"}).swapped_keys(), (std::vector<std::string>{"exp_avg_sq"}));
}

TEST(SwapOptimizerConfig, InvalidValuesAreNamed) {
  expect_config_invalid(SwapOptimizerConfig().swap_times(0), "SwapOptimizerConfig.swap_times must be positive, got 0.");
  expect_config_invalid(SwapOptimizerConfig().min_numel(-1),
                        "SwapOptimizerConfig.min_numel must be non-negative, got -1.");
  expect_config_invalid(SwapOptimizerConfig().state_keys({"exp_avg", "momentum_buffer"}),
                        "SwapOptimizerConfig.state_keys only supports Adam/AdamW states ('exp_avg', 'exp_avg_sq', "
                        "'max_exp_avg_sq', 'master_param'), but got ['momentum_buffer'].");
  expect_config_invalid(SwapOptimizerConfig().state_keys({"exp_avg", "exp_avg"}), "lists 'exp_avg' more than once");
  expect_config_invalid(SwapOptimizerConfig().state_keys({"master_param"}), "include_master_params is false");
}

}  // namespace
}  // namespace stowage::optim
