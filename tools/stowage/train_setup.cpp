#include "train_setup.h"

#include "cli_numbers.h"
#include "train_checks.h"

#include <stowage/activation/budget.h>
#include <stowage/activation/checkpoint.h>
#include <stowage/activation/policy.h>
#include <stowage/activation/sequential.h>
#include <stowage/byte_count.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/train/run_directory.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace stowage::cli {
namespace {

activation::CheckpointOptions checkpoint_options(const TrainOptions& options) {
  return activation::CheckpointOptions().offload_inputs(options.offload_checkpoint_inputs);
}

// Picks which blocks to checkpoint for --activation-budget, measuring a step as the
// Trainer does at its first one: the gradients are made in backward.
ActivationCheckpointing fit_activation_budget(LanguageModel& model, const TrainOptions& options, const Corpus& corpus,
                                              c10::Device device, int64_t ranks) {
  const int64_t budget = *parse_byte_size(options.activation_budget);  // the option's validator parsed it
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed + 2);
  const auto batch = corpus.sample(options.batch / ranks, options.seq_len, generator);
  const torch::Tensor tokens = batch.first.to(device);
  const torch::Tensor targets = batch.second.to(device);
  torch::Tensor block_input;
  {
    torch::NoGradGuard no_grad;
    model->forward(tokens, [&](torch::nn::Sequential& blocks, const torch::Tensor& x) {
      block_input = x;
      return blocks->forward(x);
    });
  }
  const int64_t vocab = LanguageModelOptions().vocab;
  const auto step_peak = [&] {
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    memory::reset_peak_memory_stats(device);
    const int64_t before = memory::memory_allocated(device);
    auto logits = model->forward(tokens);
    torch::cross_entropy_loss(logits.view({-1, vocab}), targets.reshape({-1})).backward();
    return memory::max_memory_allocated(device) - before;
  };
  const activation::FittedPlan fitted =
      activation::fit_activation_budget(model->blocks(), block_input, budget, step_peak);
  for (auto& p : model->parameters()) p.mutable_grad().reset();
  return {fitted.plan.describe(), budget, fitted.measured_peak_bytes};
}

}  // namespace

train::RunConfig run_config(const TrainOptions& options) {
  return {{"--corpus", options.corpus},
          {"--batch", std::to_string(options.batch)},
          {"--seq-len", std::to_string(options.seq_len)},
          {"--layers", std::to_string(options.layers)},
          {"--width", std::to_string(options.width)},
          {"--heads", std::to_string(options.heads)},
          {"--seed", std::to_string(options.seed)},
          {"--optimizer-update", options.optimizer_update},
          {"--offload-fraction", fmt::format("{}", options.offload_fraction)}};
}

LanguageModel make_model(const TrainOptions& options) {
  torch::manual_seed(options.seed);
  return LanguageModel(LanguageModelOptions{256, options.seq_len, options.layers, options.width, options.heads});
}

void check_run(const TrainOptions& options) {
  if (!options.swap_host_budget.empty()) {
    const int64_t least = optim::min_disk_host_budget(make_model(options)->parameters(), swap_config(options));
    if (*parse_byte_size(options.swap_host_budget) < least) {
      throw InvalidArgument(fmt::format("--swap-host-budget {} is below the {} the disk tier needs for this model",
                                        options.swap_host_budget, bytes_in_units(least)));
    }
  }
  train::check_run_directory(options.run_dir, run_config(options), options.resume, options.allow_config_change);
}

std::string ActivationCheckpointing::describe() const {
  if (budget_bytes == 0) return picked;
  return fmt::format("{} for a budget of {} (a step measured {})", picked, bytes_in_units(budget_bytes),
                     bytes_in_units(measured_peak_bytes));
}

ActivationCheckpointing configure_activation_checkpointing(LanguageModel& model, const TrainOptions& options,
                                                           const Corpus& corpus, c10::Device device, int64_t ranks) {
  if (!options.activation_budget.empty()) return fit_activation_budget(model, options, corpus, device, ranks);
  const char* offload = options.offload_checkpoint_inputs ? ", inputs offloaded" : "";
  if (options.recompute_segments > 0) return {fmt::format("{} segments{}", options.recompute_segments, offload)};
  if (options.selective_recompute.empty()) return {"off"};
  const std::string site = options.selective_recompute == "mlp" ? "mlp" : "attention_core";
  activation::apply_activation_checkpointing(*model, activation::module_name(R"(blocks\.\d+\.)" + site),
                                             checkpoint_options(options));
  return {fmt::format("selective ({}){}", options.selective_recompute, offload)};
}

torch::Tensor run_blocks(const TrainOptions& options, torch::nn::Sequential& blocks, const torch::Tensor& x) {
  if (options.recompute_segments == 0) return blocks->forward(x);
  return activation::checkpoint_sequential(blocks, options.recompute_segments, x, checkpoint_options(options));
}

std::string describe_run(const TrainOptions& options, LanguageModel& model, const Corpus& corpus,
                         const ActivationCheckpointing& activation_checkpointing, train::Trainer& trainer) {
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  optim::ZeroRedundancyOptimizer& optimizer = trainer.optimizer();
  std::string optimizer_text = options.swap_times > 0 ? fmt::format("AdamW with state swap ({} batches, to {})",
                                                                    options.swap_times, options.swap_to)
                                                      : "plain AdamW";
  if (options.optimizer_update == "host") {
    optimizer_text = options.offload_fraction == 1
                         ? "AdamW updated on the host"
                         : fmt::format("AdamW updated on the host for {} of the parameters' bytes, the rest {}",
                                       options.offload_fraction, optimizer_text);
  }
  const dist::World& world = trainer.world();
  const c10::Device device = trainer.device();
  return fmt::format(
      "training a {}-layer byte-level transformer ({:.2f}M parameters) on '{}' ({} bytes); activation "
      "checkpointing: {}; optimizer: {}; checkpoints: {}{}{}",
      options.layers, parameters / 1e6, corpus.source(), corpus.size(), activation_checkpointing.describe(),
      optimizer_text,
      options.ckpt_every > 0 ? fmt::format("every {} steps into {}/checkpoints, keeping {}", options.ckpt_every,
                                           options.run_dir, options.keep)
                             : "off",
      world.size > 1 ? fmt::format("; data-parallel over {} ranks, ZeRO stage {}: optimizer state{} sharded "
                                   "(rank 0 owns parameters {}-{} of {})",
                                   world.size, options.zero_stage, options.zero_stage == 2 ? " and gradients" : "",
                                   optimizer.owned().begin, optimizer.owned().end - 1, model->parameters().size())
                     : "",
      device.is_cpu() ? ""
                      : fmt::format("; on {}{}", device.str(),
                                    world.group ? fmt::format(", gradients reduced through c10d {}",
                                                              world.group->backend_name(device))
                                                : ""));
}

}  // namespace stowage::cli
