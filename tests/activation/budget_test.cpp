// The memory budget (activation/budget.h): the planner's choice against an exhaustive search,
// over its cost model and over measured steps of a small model on the test device (the
// simulated accelerator in builds against LibTorch 2.x, where offload is a plan too).

#include <stowage/activation/budget.h>
#include <stowage/activation/policy.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include "test_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace stowage::activation {
namespace {

using ::testing::HasSubstr;

// Calls visit(plan) for every plan of the blocks that their costs make possible.
void for_each_plan(const std::vector<BlockCosts>& costs,
                   const std::function<void(const std::vector<BlockPlan>&)>& visit,
                   std::vector<BlockPlan> prefix = {}) {
  if (prefix.size() == costs.size()) return visit(prefix);
  for (BlockPlan plan : kAllBlockPlans) {
    if (!costs[prefix.size()][static_cast<int>(plan)].possible) continue;
    prefix.push_back(plan);
    for_each_plan(costs, visit, prefix);
    prefix.pop_back();
  }
}

double recompute_s_of(const std::vector<BlockCosts>& costs, const std::vector<BlockPlan>& plan) {
  double total = 0;
  for (size_t i = 0; i < plan.size(); ++i) total += costs[i][static_cast<int>(plan[i])].recompute_s;
  return total;
}

// Blocks whose plans cost what a generator draws: keeping holds the most and recomputes
// nothing; the others hold less and recompute more, in no fixed order.
std::vector<BlockCosts> drawn_costs(std::mt19937& random, size_t blocks) {
  std::uniform_int_distribution<int64_t> bytes(1, 1000);
  std::uniform_real_distribution<double> seconds(0.001, 0.1);
  std::vector<BlockCosts> costs(blocks);
  for (BlockCosts& block : costs) {
    const int64_t keep = 1000 + bytes(random);
    block[0] = {true, keep, keep + bytes(random), 0};
    for (size_t plan = 1; plan < block.size(); ++plan) {
      const int64_t kept = bytes(random) % keep;
      block[plan] = {random() % 4 != 0, kept, kept + bytes(random) + 500, seconds(random)};
    }
  }
  return costs;
}

TEST(ActivationBudget, PlanForBudgetIsTheExhaustiveOptimumOfItsModel) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(trial);
    const std::vector<BlockCosts> costs = drawn_costs(random, 1 + trial % 6);
    const int64_t rest = static_cast<int64_t>(random() % 3000);
    int64_t least = std::numeric_limits<int64_t>::max(), most = 0;
    for_each_plan(costs, [&](const std::vector<BlockPlan>& plan) {
      least = std::min(least, predicted_peak(costs, rest, plan));
      most = std::max(most, predicted_peak(costs, rest, plan));
    });
    EXPECT_EQ(least_memory_plan(costs, rest).predicted_peak_bytes, least);
    EXPECT_FALSE(plan_for_budget(costs, rest, least - 1).has_value());
    for (int64_t budget = least; budget <= most + 100; budget += std::max<int64_t>(1, (most - least) / 17)) {
      double best = std::numeric_limits<double>::infinity();
      for_each_plan(costs, [&](const std::vector<BlockPlan>& plan) {
        if (predicted_peak(costs, rest, plan) <= budget) best = std::min(best, recompute_s_of(costs, plan));
      });
      const std::optional<ActivationPlan> plan = plan_for_budget(costs, rest, budget);
      ASSERT_TRUE(plan.has_value()) << "budget " << budget;
      EXPECT_LE(plan->predicted_peak_bytes, budget);
      EXPECT_EQ(predicted_peak(costs, rest, plan->blocks), plan->predicted_peak_bytes);
      EXPECT_NEAR(plan->recompute_s, best, 1e-12) << "budget " << budget;
    }
  }
}

constexpr int64_t kMlpWidth = 64;
constexpr int64_t kMlpRows = 128;

// x + mlp(norm(x)), its MLP run through a CheckpointSite (selective recompute).
class ResidualMlpImpl : public torch::nn::Module {
 public:
  ResidualMlpImpl()
      : norm_(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kMlpWidth})))),
        in_(register_module("in", torch::nn::Linear(kMlpWidth, 4 * kMlpWidth))),
        out_(register_module("out", torch::nn::Linear(4 * kMlpWidth, kMlpWidth))),
        mlp_(register_module("mlp", CheckpointSite())) {}

  at::Tensor forward(const at::Tensor& x) {
    return x + mlp_->forward([this](const at::Tensor& h) { return out_->forward(torch::gelu(in_->forward(h))); },
                             norm_->forward(x));
  }

 private:
  torch::nn::LayerNorm norm_;
  torch::nn::Linear in_, out_;
  CheckpointSite mlp_;
};
TORCH_MODULE(ResidualMlp);

// Three blocks and a head after them, on the test device, and one step's activation peak.
struct SmallModel {
  c10::Device device = testing::test_device();
  torch::nn::Sequential blocks;
  torch::nn::Linear head{kMlpWidth, 8 * kMlpWidth};
  at::Tensor input;

  SmallModel() {
    torch::manual_seed(3);
    for (int i = 0; i < 3; ++i) blocks->push_back(ResidualMlp());
    blocks->to(device);
    head->to(device);
    input = torch::randn({kMlpRows, kMlpWidth}, torch::TensorOptions().device(device));
    memory::enable_accounting();
  }

  int64_t step_peak() {
    memory::reset_peak_memory_stats(device);
    const int64_t before = memory::memory_allocated(device);
    head->forward(blocks->forward(input.detach().requires_grad_())).pow(2).mean().backward();
    return memory::max_memory_allocated(device) - before;
  }

  // The measured peak of every possible plan.
  std::vector<std::pair<std::vector<BlockPlan>, int64_t>> measure_every_plan(const std::vector<BlockCosts>& costs) {
    std::vector<std::pair<std::vector<BlockPlan>, int64_t>> peaks;
    for_each_plan(costs, [&](const std::vector<BlockPlan>& plan) {
      apply_plan(blocks, plan);
      step_peak();  // first-use allocations aside
      peaks.emplace_back(plan, step_peak());
      clear_activation_checkpointing(*blocks);
    });
    return peaks;
  }
};

// The blocks' measured costs with given recompute times in place of the measured ones, which
// vary with the machine's load: the bytes are what the planner's choice depends on here. A
// block recomputes its MLP (selective) in less than its whole forward (checkpoint), and with
// offload pays a copy besides; later blocks cost more, so that plans differ in time too.
std::vector<BlockCosts> with_given_times(std::vector<BlockCosts> costs) {
  for (size_t i = 0; i < costs.size(); ++i) {
    const double scale = 1.0 + 0.5 * static_cast<double>(i);
    costs[i][static_cast<int>(BlockPlan::kSelective)].recompute_s = 0.002 * scale;
    costs[i][static_cast<int>(BlockPlan::kCheckpoint)].recompute_s = 0.003 * scale;
    costs[i][static_cast<int>(BlockPlan::kCheckpointOffload)].recompute_s = 0.0035 * scale;
  }
  return costs;
}

TEST(ActivationBudget, MeasuredPeakFitsAndRecomputesWithinATenthOfTheExhaustiveOptimum) {
  SmallModel model;
  model.step_peak();
  const int64_t unplanned = model.step_peak();
  const std::vector<BlockCosts> costs = with_given_times(profile_blocks(model.blocks, model.input));
  const auto peaks = model.measure_every_plan(costs);
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& [plan, peak] : peaks) least = std::min(least, peak);
  ASSERT_LT(least, unplanned);

  // Three budgets between the least-memory plan's peak and the unplanned one.
  for (const double share : {0.1, 0.5, 0.9}) {
    const auto budget =
        static_cast<int64_t>(static_cast<double>(least) + share * static_cast<double>(unplanned - least));
    SCOPED_TRACE(budget);
    // Measured as every plan was above: after a step that makes the plan's first-use
    // allocations (the offload's host buffers), so that both sides compare the same peaks.
    const FittedPlan fitted = fit_activation_budget(model.blocks, costs, budget, [&] {
      model.step_peak();
      return model.step_peak();
    });
    EXPECT_LE(fitted.measured_peak_bytes, budget) << fitted.plan.describe();
    EXPECT_LE(model.step_peak(), budget) << "the plan applied is the plan measured";
    // The exhaustive optimum: the plan of least recompute time among those whose measured
    // peak fits.
    double optimum = std::numeric_limits<double>::infinity();
    for (const auto& [plan, peak] : peaks) {
      if (peak <= budget) optimum = std::min(optimum, recompute_s_of(costs, plan));
    }
    EXPECT_DOUBLE_EQ(fitted.plan.recompute_s, recompute_s_of(costs, fitted.plan.blocks));
    EXPECT_LE(fitted.plan.recompute_s, 1.1 * optimum + 1e-12) << fitted.plan.describe();
    clear_activation_checkpointing(*model.blocks);
  }
}

TEST(ActivationBudget, FittingOnGivenCostsChecksThemFirst) {
  SmallModel model;
  std::vector<BlockCosts> costs = with_given_times(profile_blocks(model.blocks, model.input));
  const auto peak = [&] { return model.step_peak(); };
  try {
    fit_activation_budget(model.blocks, std::vector<BlockCosts>(costs.begin(), costs.end() - 1), 1 << 30, peak);
    ADD_FAILURE() << "took the costs of 2 blocks for 3";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("costs of 2 blocks for a Sequential of 3"));
  }
  costs[1][static_cast<int>(BlockPlan::kKeep)].possible = false;
  EXPECT_THROW(fit_activation_budget(model.blocks, costs, 1 << 30, peak), InvalidArgument);
  EXPECT_EQ(clear_activation_checkpointing(*model.blocks), 0) << "the blocks were left checkpointed";
}

TEST(ActivationBudget, ABudgetBelowTheLeastPeakNamesItAndChangesNothing) {
  SmallModel model;
  const at::Tensor before = model.blocks->forward(model.input).cpu();
  for (const int64_t budget : {int64_t{1}, int64_t{1000}}) {
    try {
      fit_activation_budget(model.blocks, model.input, budget, [&] { return model.step_peak(); });
      FAIL() << "a budget of " << budget << " bytes was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("below the smallest activation peak any plan reaches"));
      EXPECT_THAT(e.what(), HasSubstr("measured with"));
    }
    EXPECT_EQ(clear_activation_checkpointing(*model.blocks), 0) << "the blocks were left checkpointed";
  }
  EXPECT_TRUE(torch::equal(model.blocks->forward(model.input).cpu(), before));
  for (const int64_t budget : {int64_t{0}, int64_t{-5}}) {
    EXPECT_THROW(fit_activation_budget(model.blocks, model.input, budget, [&] { return model.step_peak(); }),
                 InvalidArgument);
  }
}

TEST(ActivationBudget, BlocksCheckpointedAlreadyAreRefused) {
  SmallModel model;
  apply_plan(model.blocks, {BlockPlan::kKeep, BlockPlan::kCheckpoint, BlockPlan::kKeep});
  try {
    profile_blocks(model.blocks, model.input);
    FAIL() << "profiled checkpointed blocks";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("block 1 is checkpointed already"));
  }
  clear_activation_checkpointing(*model.blocks);
  apply_plan(model.blocks, {BlockPlan::kSelective, BlockPlan::kKeep, BlockPlan::kKeep});
  EXPECT_THROW(profile_blocks(model.blocks, model.input), InvalidArgument);
}

TEST(ActivationBudget, ASequentialsNamedBlocksArePlannedInTheirOrder) {
  torch::nn::Sequential blocks({{"first", ResidualMlp()}, {"second", ResidualMlp()}});
  apply_plan(blocks, {BlockPlan::kKeep, BlockPlan::kCheckpoint});
  EXPECT_EQ(std::dynamic_pointer_cast<CheckpointWrapperImpl>(blocks->ptr(0)), nullptr);
  const auto wrapper = std::dynamic_pointer_cast<CheckpointWrapperImpl>(blocks->ptr(1));
  ASSERT_NE(wrapper, nullptr);
  EXPECT_EQ(wrapper->wrapped(), blocks->named_children()["second"]);
  EXPECT_EQ(clear_activation_checkpointing(*blocks), 1);
}

TEST(ActivationBudget, OffloadIsAPlanOnAnAcceleratorOnly) {
  SmallModel model;
  const std::vector<BlockCosts> costs = profile_blocks(model.blocks, model.input);
  for (const BlockCosts& block : costs) {
    EXPECT_TRUE(block[static_cast<int>(BlockPlan::kSelective)].possible);
    EXPECT_EQ(block[static_cast<int>(BlockPlan::kCheckpointOffload)].possible, !model.device.is_cpu());
    // Recomputing holds less from forward to backward than keeping.
    EXPECT_LT(block[static_cast<int>(BlockPlan::kCheckpoint)].kept_bytes,
              block[static_cast<int>(BlockPlan::kKeep)].kept_bytes);
  }
  EXPECT_THROW(apply_plan(model.blocks, {BlockPlan::kKeep}), InvalidArgument);
}

}  // namespace
}  // namespace stowage::activation
