#include "cli_numbers.h"
#include "commands.h"

#include "activation_bench.h"
#include "emit.h"
#include "python_peer.h"

#include <stowage/error.h>

#include <memory>

namespace stowage::cli {

void add_bench_activation(CLI::App& bench) {
  auto* command = bench.add_subcommand(
      "activation",
      "Activation checkpointing: step time and peak memory of a deep MLP, plain vs checkpoint_sequential");
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
  command->callback([config, json, device] {
    if (config->peer && !stowage::bench::python_peer_available()) {
      throw Error(stowage::bench::python_peer_unavailable_reason());
    }
    config->device = stowage::cli::parse_device(*device);
    const auto result = stowage::bench::run_activation_bench(*config);
    stowage::bench::print_result(stowage::bench::to_json(result), stowage::bench::to_text(result), *json);
  });
}

}  // namespace stowage::cli
