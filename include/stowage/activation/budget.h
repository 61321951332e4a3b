#pragma once

// A memory budget that picks what to recompute (as torch.compile's
// activation_memory_budget and Checkmate do), for a model whose activations come from a
// chain of blocks (a torch::nn::Sequential): each block's forward runs plainly, with its
// CheckpointSites enabled (selective recompute), under checkpoint(), or under checkpoint()
// with its input offloaded to host memory. The plan of least recomputation whose
// activation peak fits the budget is chosen from each block's measured memory and time.
//
//   auto plan = activation::fit_activation_budget(model->blocks(), block_input, budget,
//                                                 [&] { return one_step_activation_peak(); });
//
// The blocks' peak model: block i keeps kept(i) bytes from its forward to its backward,
// and its own forward and backward need peak(i) bytes above what the blocks before it
// keep; the rest of the model (the layers after the chain, the loss) is one last element
// that keeps nothing and peaks at what a step measured beyond the blocks. The predicted
// peak is then exact to compute over the chain, and the search over plans exact under it
// (dynamic programming from the last block, keeping the plans that no other beats in both
// peak and time). What the model misses (the allocator, layers before the chain) is found
// by measuring real steps, and corrected for.

#include <stowage/activation/checkpoint.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace stowage::activation {

enum class BlockPlan {
  kKeep,               // the block's forward runs plainly and keeps its activations
  kSelective,          // its CheckpointSites are enabled (only for a block that has some)
  kCheckpoint,         // checkpoint(): only its input is kept, the forward runs again in backward
  kCheckpointOffload,  // and that input waits in host memory (only for a tensor on an accelerator)
};
inline constexpr std::array<BlockPlan, 4> kAllBlockPlans = {BlockPlan::kKeep, BlockPlan::kSelective,
                                                            BlockPlan::kCheckpoint, BlockPlan::kCheckpointOffload};
const char* block_plan_name(BlockPlan plan);  // "keep", "selective", "checkpoint", "offload"

// One block's measured cost of one plan.
struct BlockCost {
  bool possible = false;   // kSelective without a site, kCheckpointOffload on the CPU: not
  int64_t kept_bytes = 0;  // held from the block's forward to its backward, its output aside
  int64_t peak_bytes = 0;  // most held during its forward and backward, above its input and output gradient
  double recompute_s = 0;  // time of its forward and backward beyond kKeep's, at least 0
};
using BlockCosts = std::array<BlockCost, kAllBlockPlans.size()>;  // indexed by BlockPlan

// Runs each block's forward and backward under each plan, on `input`'s device: block 0 on
// `input`, each next block on the output before it (computed without grad). After a
// warm-up round, `repeats` rounds run every plan once each; a time is the least of its
// rounds (a load only lengthens one), the bytes are the last round's (they do not vary).
// REQUIRES: `blocks` carries no checkpointing (clear_activation_checkpointing), repeats >= 1.
std::vector<BlockCosts> profile_blocks(torch::nn::Sequential& blocks, const at::Tensor& input, int repeats = 3);

struct ActivationPlan {
  std::vector<BlockPlan> blocks;     // one per entry of the Sequential
  int64_t predicted_peak_bytes = 0;  // by the model above
  double recompute_s = 0;            // the blocks' recompute_s added up: the time a step pays
  std::string describe() const;      // "keep x2, checkpoint x2"
};

// The plan of least recompute_s whose predicted peak, with `rest_peak_bytes` for what
// follows the blocks, is at most budget_bytes; none if no plan's is.
std::optional<ActivationPlan> plan_for_budget(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes,
                                              int64_t budget_bytes);
// The plan of least predicted peak (of least recompute_s among those).
ActivationPlan least_memory_plan(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes);
// The predicted peak of `plan`. REQUIRES: plan.blocks.size() == costs.size().
int64_t predicted_peak(const std::vector<BlockCosts>& costs, int64_t rest_peak_bytes,
                       const std::vector<BlockPlan>& plan);

// Makes each block run as `plan` says, with `options` (plus offload_inputs for
// kCheckpointOffload). REQUIRES: `blocks` carries no checkpointing.
void apply_plan(torch::nn::Sequential& blocks, const std::vector<BlockPlan>& plan,
                const CheckpointOptions& options = {});

struct FittedPlan {
  ActivationPlan plan;              // applied to the blocks
  int64_t measured_peak_bytes = 0;  // what measure_step_peak reported with it
  std::vector<BlockCosts> costs;    // what the blocks measured (profile_blocks)
  int64_t rest_peak_bytes = 0;      // what the rest of the model measured
};

// Profiles the blocks on `input`, measures a step without checkpointing (for
// rest_peak_bytes), then applies the plan of least recomputation that fits budget_bytes as
// `measure_step_peak` reports it: one training step's activation bytes, with whatever plan
// is applied to `blocks` at the time. A plan predicted to fit that measures over is planned
// again for a budget lower by the most a plan measured above its prediction, up to 4 plans;
// then the least-memory plan is taken if it measures within the budget.
// Throws InvalidArgument, with `blocks` as they were, when budget_bytes <= 0 or when even
// the least-memory plan measures over it, naming that plan's peak: the smallest budget
// that fits.
// REQUIRES: `blocks` carries no checkpointing.
FittedPlan fit_activation_budget(torch::nn::Sequential& blocks, const at::Tensor& input, int64_t budget_bytes,
                                 const std::function<int64_t()>& measure_step_peak,
                                 const CheckpointOptions& options = {}, int repeats = 3);
// The same over `costs` given rather than profiled: those of an earlier profile_blocks of
// these blocks, to fit several budgets with one profile, or with the times replaced by the
// caller's (the plans' bytes are still measured by measure_step_peak).
// Throws InvalidArgument, as the other does, and when `costs` does not have one entry per
// block, each with kKeep possible.
// REQUIRES: `blocks` carries no checkpointing.
FittedPlan fit_activation_budget(torch::nn::Sequential& blocks, std::vector<BlockCosts> costs, int64_t budget_bytes,
                                 const std::function<int64_t()>& measure_step_peak,
                                 const CheckpointOptions& options = {});

}  // namespace stowage::activation
