// profile_blocks: each block's memory and time under each plan (budget.h).

#include <stowage/activation/budget.h>

#include <stowage/activation/policy.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>

namespace stowage::activation {
namespace {

int64_t bytes_of(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * t.element_size();
}

// Waits for the work issued on the device's current stream, so that a time covers it.
void synchronize(c10::Device device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->getStream(device).synchronize();
}

bool has_site(const torch::nn::Module& block) {
  for (const auto& module : block.modules(/*include_self=*/false)) {
    if (dynamic_cast<const CheckpointSiteImpl*>(module.get()) != nullptr) return true;
  }
  return false;
}

void require_unplanned(torch::nn::SequentialImpl& blocks) {
  for (const auto& item : blocks.named_modules()) {
    const auto* site = dynamic_cast<const CheckpointSiteImpl*>(item.value().get());
    if (site != nullptr && site->enabled()) {
      throw InvalidArgument(fmt::format(
          "activation budget: site '{}' is checkpointed already; clear_activation_checkpointing() first", item.key()));
    }
  }
  size_t i = 0;
  for (const torch::nn::AnyModule& entry : blocks) {
    if (dynamic_cast<const CheckpointWrapperImpl*>(entry.ptr().get()) != nullptr) {
      throw InvalidArgument(fmt::format(
          "activation budget: block {} is checkpointed already; clear_activation_checkpointing() first", i));
    }
    ++i;
  }
}

struct Sample {
  int64_t forward_peak = 0, kept = 0, backward_peak = 0;
  double seconds = 0;
};

// One forward and backward of `block` on `input`, in the chain's terms (budget.h): bytes
// above what the blocks before it keep. The input is made a non-leaf, as in the chain, so
// that only what the block's graph saves keeps it. The leaf it hangs from is not the
// chain's, nor the output gradient during the forward, nor the output once the forward is
// done (the next block holds it, and releases it in its backward).
Sample run_once(torch::nn::AnyModule& block, const at::Tensor& input, const at::Tensor& output_grad) {
  const c10::Device device = input.device();
  const at::Tensor leaf = input.detach().requires_grad_(true);
  at::Tensor x = leaf * 1;
  synchronize(device);
  memory::reset_peak_memory_stats(device);
  const int64_t chain = memory::memory_allocated(device) - bytes_of(leaf) - bytes_of(x) - bytes_of(output_grad);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor y = block.forward(x);
  synchronize(device);
  Sample sample;
  sample.forward_peak = memory::max_memory_allocated(device) - chain - bytes_of(leaf) - bytes_of(output_grad);
  x = at::Tensor();  // from now on, only the block's graph holds its input
  sample.kept = memory::memory_allocated(device) - chain - bytes_of(leaf) - bytes_of(output_grad) - bytes_of(y);
  memory::reset_peak_memory_stats(device);
  torch::autograd::backward({y}, {output_grad});
  synchronize(device);
  sample.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sample.backward_peak = memory::max_memory_allocated(device) - chain - bytes_of(leaf) - bytes_of(y);
  return sample;
}

}  // namespace

std::vector<BlockCosts> profile_blocks(torch::nn::Sequential& blocks, const at::Tensor& input, int repeats) {
  if (repeats < 1) throw InvalidArgument(fmt::format("profile_blocks: repeats is {}, at least 1 is needed", repeats));
  if (!input.defined()) throw InvalidArgument("profile_blocks: the input is undefined");
  require_unplanned(*blocks);
  memory::enable_accounting();
  const bool on_accelerator = !input.device().is_cpu();

  // Each block's input: what the blocks before it make of `input`.
  std::vector<at::Tensor> inputs = {input.detach()};
  {
    at::NoGradGuard no_grad;
    for (torch::nn::AnyModule& block : *blocks) inputs.push_back(block.forward(inputs.back()));
  }
  std::vector<bool> has_sites;
  for (const auto& block : blocks->children()) has_sites.push_back(has_site(*block));
  const bool any_sites = std::find(has_sites.begin(), has_sites.end(), true) != has_sites.end();
  std::vector<BlockPlan> plans;
  for (BlockPlan plan : kAllBlockPlans) {
    if (plan == BlockPlan::kSelective && !any_sites) continue;
    if (plan == BlockPlan::kCheckpointOffload && !on_accelerator) continue;
    plans.push_back(plan);
  }

  // Round 0 is a warm-up (first-use allocations such as the parameters' gradients), then
  // each round runs every plan once, so that a time a load slowed down is not one plan's
  // alone. The bytes do not vary from round to round; a block's time is its least, which
  // a load can only lengthen.
  std::vector<BlockCosts> costs(blocks->size());
  for (int round = 0; round <= repeats; ++round) {
    for (BlockPlan plan : plans) {
      apply_plan(blocks, std::vector<BlockPlan>(blocks->size(), plan));
      try {
        size_t i = 0;
        for (torch::nn::AnyModule& block : *blocks) {
          if (plan != BlockPlan::kSelective || has_sites[i]) {
            const Sample sample = run_once(block, inputs[i], at::ones_like(inputs[i + 1]));
            BlockCost& cost = costs[i][static_cast<int>(plan)];
            if (round == 1 || (round > 1 && sample.seconds < cost.recompute_s)) cost.recompute_s = sample.seconds;
            cost.possible = true;
            cost.kept_bytes = sample.kept;
            cost.peak_bytes = std::max(sample.forward_peak, sample.backward_peak);
          }
          ++i;
        }
      } catch (...) {
        clear_activation_checkpointing(*blocks);
        throw;
      }
      clear_activation_checkpointing(*blocks);
    }
  }
  // Time beyond running plainly: what the plan recomputes.
  for (BlockCosts& block : costs) {
    const double keep_s = block[static_cast<int>(BlockPlan::kKeep)].recompute_s;
    for (BlockCost& cost : block) cost.recompute_s = std::max(0.0, cost.recompute_s - keep_s);
  }
  return costs;
}

}  // namespace stowage::activation
