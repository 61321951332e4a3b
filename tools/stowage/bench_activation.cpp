#include "cli_numbers.h"
#include "commands.h"

#include "activation_bench.h"

#include <fmt/format.h>

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
  command->add_option("--segments", config->segments, "segment counts (default 2 4 8 and round(sqrt(blocks)))")
      ->check(positive_integer<int64_t>());
  auto device = std::make_shared<std::string>("cpu");
  command->add_option("--device", *device, "where the model runs, e.g. cuda:0 (default cpu)");
  command->callback([config, json, device] {
    config->device = stowage::cli::parse_device(*device);
    const auto result = stowage::bench::run_activation_bench(*config);
    fmt::print("{}\n", *json ? stowage::bench::to_json(result).dump(2) : stowage::bench::to_text(result));
  });
}

}  // namespace stowage::cli
