#include <stowage/activation/budget.h>

#include <stowage/activation/policy.h>
#include <stowage/byte_count.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace stowage::activation {
namespace {

// A plan of the blocks from some block on, with what it predicts for them: the most they
// hold above what the blocks before them keep.
struct Suffix {
  int64_t peak_bytes;
  double recompute_s;
  std::vector<BlockPlan> plans;  // from the last block back
};

// The suffixes that no other beats in both peak and time, by increasing peak (so by
// decreasing time).
std::vector<Suffix> pareto_front(std::vector<Suffix> suffixes) {
  std::sort(suffixes.begin(), suffixes.end(), [](const Suffix& a, const Suffix& b) {
    return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.recompute_s < b.recompute_s;
  });
  std::vector<Suffix> front;
  for (Suffix& suffix : suffixes) {
    if (front.empty() || suffix.recompute_s < front.back().recompute_s) front.push_back(std::move(suffix));
  }
  return front;
}

// Every plan of the whole chain that no other beats, by dynamic programming from the last
// block: block i's plan m makes a suffix's peak max(peak(i, m), kept(i, m) + the rest's).
std::vector<Suffix> all_best_plans(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes) {
  std::vector<Suffix> front = {{rest_peak_bytes, 0, {}}};
  for (auto block = costs.rbegin(); block != costs.rend(); ++block) {
    std::vector<Suffix> next;
    for (const Suffix& suffix : front) {
      for (BlockPlan plan : kAllBlockPlans) {
        const BlockCost& cost = (*block)[static_cast<int>(plan)];
        if (!cost.possible) continue;
        Suffix longer{std::max(cost.peak_bytes, cost.kept_bytes + suffix.peak_bytes),
                      suffix.recompute_s + cost.recompute_s, suffix.plans};
        longer.plans.push_back(plan);
        next.push_back(std::move(longer));
      }
    }
    front = pareto_front(std::move(next));
  }
  return front;
}

ActivationPlan to_plan(Suffix suffix) {
  ActivationPlan plan;
  plan.blocks.assign(suffix.plans.rbegin(), suffix.plans.rend());
  plan.predicted_peak_bytes = suffix.peak_bytes;
  plan.recompute_s = suffix.recompute_s;
  return plan;
}

void check_costs(const std::vector<BlockCosts>& costs) {
  for (size_t i = 0; i < costs.size(); ++i) {
    if (!costs[i][static_cast<int>(BlockPlan::kKeep)].possible) {
      throw InvalidArgument(fmt::format("activation budget: block {} has no cost for running plainly", i));
    }
  }
}

void check_fit_arguments(int64_t budget_bytes, const std::function<int64_t()>& measure_step_peak) {
  if (budget_bytes <= 0) {
    throw InvalidArgument(fmt::format("activation budget: {} bytes is no budget; give a positive size", budget_bytes));
  }
  if (!measure_step_peak) throw InvalidArgument("activation budget: measure_step_peak is empty");
}

}  // namespace

const char* block_plan_name(BlockPlan plan) {
  switch (plan) {
    case BlockPlan::kKeep:
      return "keep";
    case BlockPlan::kSelective:
      return "selective";
    case BlockPlan::kCheckpoint:
      return "checkpoint";
    case BlockPlan::kCheckpointOffload:
      return "offload";
  }
  return "?";
}

std::string ActivationPlan::describe() const {
  std::string out;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i;
    while (j < blocks.size() && blocks[j] == blocks[i]) ++j;
    out += fmt::format("{}{}{}", out.empty() ? "" : ", ", block_plan_name(blocks[i]),
                       j - i > 1 ? fmt::format(" x{}", j - i) : "");
    i = j;
  }
  return out.empty() ? "no blocks" : out;
}

int64_t predicted_peak(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes,
                       const std::vector<BlockPlan>& plan) {
  if (plan.size() != costs.size()) {
    throw InvalidArgument(fmt::format("activation budget: a plan of {} blocks for {}", plan.size(), costs.size()));
  }
  int64_t peak = rest_peak_bytes;
  for (size_t i = costs.size(); i-- > 0;) {
    const BlockCost& cost = costs[i][static_cast<int>(plan[i])];
    if (!cost.possible) {
      throw InvalidArgument(fmt::format("activation budget: block {} cannot run as '{}'", i, block_plan_name(plan[i])));
    }
    peak = std::max(cost.peak_bytes, cost.kept_bytes + peak);
  }
  return peak;
}

std::optional<ActivationPlan> plan_for_budget(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes,
                                              int64_t budget_bytes) {
  check_costs(costs);
  std::vector<Suffix> front = all_best_plans(costs, rest_peak_bytes);
  // By increasing peak and decreasing time: the last that fits recomputes least.
  auto fits = std::find_if(front.rbegin(), front.rend(),
                           [budget_bytes](const Suffix& s) { return s.peak_bytes <= budget_bytes; });
  if (fits == front.rend()) return std::nullopt;
  return to_plan(std::move(*fits));
}

ActivationPlan least_memory_plan(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes) {
  check_costs(costs);
  return to_plan(std::move(all_best_plans(costs, rest_peak_bytes).front()));
}

void apply_plan(torch::nn::Sequential& blocks, const std::vector<BlockPlan>& plan, const CheckpointOptions& options) {
  if (plan.size() != blocks->size()) {
    throw InvalidArgument(
        fmt::format("activation budget: a plan of {} blocks for a Sequential of {}", plan.size(), blocks->size()));
  }
  // A Sequential's children are named by their index, or by the names it was given.
  std::map<std::string, size_t> block_of;
  for (const auto& child : blocks->named_children()) block_of.emplace(child.key(), block_of.size());
  const auto selects = [&](BlockPlan wanted, bool sites) -> ModuleSelector {
    return [&, wanted, sites](const std::string& name, const torch::nn::Module& module) {
      const size_t dot = name.find('.');
      const bool is_site = dynamic_cast<const CheckpointSiteImpl*>(&module) != nullptr;
      return plan[block_of.at(name.substr(0, dot))] == wanted &&
             (sites ? dot != std::string::npos && is_site : dot == std::string::npos);
    };
  };
  const auto any = [&plan](BlockPlan wanted) { return std::find(plan.begin(), plan.end(), wanted) != plan.end(); };
  if (any(BlockPlan::kSelective))
    apply_activation_checkpointing(*blocks, selects(BlockPlan::kSelective, true), options);
  if (any(BlockPlan::kCheckpoint)) {
    apply_activation_checkpointing(*blocks, selects(BlockPlan::kCheckpoint, false), options);
  }
  if (any(BlockPlan::kCheckpointOffload)) {
    apply_activation_checkpointing(*blocks, selects(BlockPlan::kCheckpointOffload, false),
                                   CheckpointOptions(options).offload_inputs(true));
  }
}

FittedPlan fit_activation_budget(torch::nn::Sequential& blocks, const at::Tensor& input, int64_t budget_bytes,
                                 const std::function<int64_t()>& measure_step_peak, const CheckpointOptions& options,
                                 int repeats) {
  check_fit_arguments(budget_bytes, measure_step_peak);  // before the profile's time is spent
  return fit_activation_budget(blocks, profile_blocks(blocks, input, repeats), budget_bytes, measure_step_peak,
                               options);
}

FittedPlan fit_activation_budget(torch::nn::Sequential& blocks, std::vector<BlockCosts> costs, int64_t budget_bytes,
                                 const std::function<int64_t()>& measure_step_peak, const CheckpointOptions& options) {
  check_fit_arguments(budget_bytes, measure_step_peak);
  if (costs.size() != blocks->size()) {
    throw InvalidArgument(
        fmt::format("activation budget: costs of {} blocks for a Sequential of {}", costs.size(), blocks->size()));
  }
  check_costs(costs);
  FittedPlan fitted;
  fitted.costs = std::move(costs);
  int64_t kept_by_blocks = 0;
  for (const BlockCosts& block : fitted.costs) kept_by_blocks += block[static_cast<int>(BlockPlan::kKeep)].kept_bytes;
  const int64_t unplanned_peak = measure_step_peak();
  fitted.rest_peak_bytes = std::max<int64_t>(0, unplanned_peak - kept_by_blocks);

  // Applies `plan` and measures a step; true if it fits (the plan stays applied then).
  const auto fits = [&](ActivationPlan plan) {
    clear_activation_checkpointing(*blocks);
    apply_plan(blocks, plan.blocks, options);
    fitted.measured_peak_bytes = measure_step_peak();
    fitted.plan = std::move(plan);
    return fitted.measured_peak_bytes <= budget_bytes;
  };
  try {
    // A plan that measures over the budget shows how far the model under-predicts (e.g. the
    // first block's offload frees nothing while the caller holds the input too): the next
    // is planned for the budget less the largest such miss, not less the excess alone,
    // which a plan predicted well below the budget would leave too small.
    int64_t miss = 0;
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::optional<ActivationPlan> plan = plan_for_budget(fitted.costs, fitted.rest_peak_bytes, budget_bytes - miss);
      if (!plan) break;
      const int64_t predicted = plan->predicted_peak_bytes;
      if (fits(std::move(*plan))) return fitted;
      miss = std::max(miss, fitted.measured_peak_bytes - predicted);
    }
    if (fits(least_memory_plan(fitted.costs, fitted.rest_peak_bytes))) return fitted;
  } catch (...) {
    clear_activation_checkpointing(*blocks);
    throw;
  }
  clear_activation_checkpointing(*blocks);
  throw InvalidArgument(
      fmt::format("activation budget: {} is below the smallest activation peak any plan reaches: {}, measured with {} "
                  "(without checkpointing {})",
                  bytes_exactly(budget_bytes), bytes_exactly(fitted.measured_peak_bytes), fitted.plan.describe(),
                  bytes_exactly(unplanned_peak)));
}

}  // namespace stowage::activation
