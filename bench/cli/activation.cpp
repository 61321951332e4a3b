#include "cli_numbers.h"
#include "bench_commands.h"
#include "device_option.h"

#include "activation_train.h"

#include "activation_bench.h"
#include "emit.h"
#include "python_peer.h"

#include <stowage/error.h>

#include <memory>

namespace stowage::cli {

void add_bench_activation(CLI::App& bench) {
  auto* command = bench.add_subcommand(
      "activation",
      "Activation checkpointing: step time and peak memory of a deep MLP, plain vs checkpoint_sequential; with "
      "--train-model, of `stowage train`'s transformer under each way of checkpointing it");
  auto config = std::make_shared<stowage::bench::ActivationBenchConfig>();
  auto json = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "print the figures as JSON");
  command->add_option("--blocks", config->blocks, "Linear + GELU blocks")->check(positive_integer<int64_t>());
  command->add_option("--width", config->width, "features per layer")->check(positive_integer<int64_t>());
  command->add_option("--batch", config->batch, "rows per step")->check(positive_integer<int64_t>());
  command->add_option("--repetitions", config->repetitions, "timed steps per configuration")
      ->check(positive_integer<int>());
  command
      ->add_option("--segments", config->segments,
                   "segment counts (default: 2 4 8 up to --blocks, and round(sqrt(blocks)))")
      ->check(positive_integer<int64_t>());
  command->add_flag("--peer", config->peer,
                    "also measure PyTorch's torch.utils.checkpoint.checkpoint_sequential (reentrant and not) on the "
                    "same model (the torch wheel's Python), taking turns with stowage");
  command->add_flag("!--no-cpu-cache", config->cpu_cache,
                    "let the CPU allocator release every block a step frees instead of keeping it for the next step");
  auto device = std::make_shared<std::string>("cpu");
  command->add_option("--device", *device, "where the model runs, e.g. cuda:0 (default cpu)");
  auto train_model = std::make_shared<bool>(false);
  auto train = std::make_shared<ActivationTrainBenchOptions>();
  command->add_flag("--train-model", *train_model,
                    "measure `stowage train`'s transformer instead: none, whole blocks (sqrt(n) and n segments, "
                    "offloaded on a device), attention core, MLP, and --activation-budget at --budget-shares of the "
                    "way from the least of their peaks to none's, at each --seq-lens");
  command->add_option("--train-device", train->train.device, "with --train-model: cpu for time, sim for device memory")
      ->capture_default_str();
  command->add_option("--seq-lens", train->seq_lens, "with --train-model: sequence lengths")
      ->check(positive_integer<int64_t>());
  command->add_option("--train-layers", train->train.layers, "with --train-model: transformer blocks")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  command->add_option("--train-width", train->train.width, "with --train-model: model width")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  command->add_option("--train-steps", train->train.steps, "with --train-model: steps per run, 2 of them warm-up")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  command->add_option("--train-rounds", train->rounds, "with --train-model: runs of each mode, taking turns")
      ->check(positive_integer<int>())
      ->capture_default_str();
  command->add_option("--budget-shares", train->budget_shares,
                      "with --train-model: the budgets, as shares of the way from the least activation peak of the "
                      "other modes to the peak without checkpointing");
  command->callback([config, json, device, train_model, train] {
    if (*train_model) {
      const ActivationTrainBenchResult result = run_activation_train_bench(*train);
      stowage::bench::print_result(to_json(result), to_text(result), *json);
      return;
    }
    if (config->peer && !stowage::bench::python_peer_available()) {
      throw Error(stowage::bench::python_peer_unavailable_reason());
    }
    config->device = stowage::cli::parse_device(*device);
    const auto result = stowage::bench::run_activation_bench(*config);
    stowage::bench::print_result(stowage::bench::to_json(result), stowage::bench::to_text(result), *json);
  });
}

}  // namespace stowage::cli
