#include "cli_numbers.h"
#include "bench_commands.h"
#include "device_option.h"

#include <emit.h>
#include <swap_bench.h>
#include <swap_disk_bench.h>

namespace stowage::cli {

void add_bench_swap(CLI::App& bench) {
  auto options = std::make_shared<bench::SwapBenchOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand("swap", "Optimizer-state swap: plain AdamW vs swap_times 2, 4, 16");
  cmd->add_option("--params", options->params, "fp32 parameters in all (default 100M)")
      ->check(positive_integer<int64_t>());
  cmd->add_option("--tensors", options->tensors, "number of parameter tensors (default 50)")
      ->check(positive_integer<int64_t>());
  cmd->add_option("--warmup-steps", options->warmup_steps, "untimed steps per configuration (default 2)")
      ->check(non_negative_integer<int>());
  cmd->add_option("--steps", options->steps, "timed steps per configuration, taken in turns (default 7)")
      ->check(positive_integer<int>());
  auto cache_mib = std::make_shared<int64_t>(options->cpu_cache_bytes >> 20);
  cmd->add_option("--cpu-cache-mib", *cache_mib,
                  "CPU allocator block cache, like a device's caching allocator (0: none; default 2048)")
      ->check(integer_in<int64_t>(0, std::numeric_limits<int64_t>::max() >> 20));
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device, "where the parameters and updates are, e.g. cuda:0 (default cpu)");
  cmd->add_flag("--json", *json, "print the figures as JSON");
  // The disk tier: its own sizes, since its point is a state many times the host budget.
  auto tier = std::make_shared<std::string>("host");
  auto disk = std::make_shared<bench::SwapDiskBenchOptions>();
  auto state_size = std::make_shared<std::string>("2GiB");
  auto budget = std::make_shared<std::string>("256MiB");
  cmd->add_option("--tier", *tier, "where swapped states live: host (default) or disk")
      ->check(CLI::IsMember({"host", "disk"}));
  cmd->add_option("--dir", disk->dir, "--tier disk: directory for the scratch files (default: the temporary one)");
  cmd->add_option("--state-size", *state_size, "--tier disk: AdamW state in all, e.g. 2GiB (default)")
      ->check(byte_size());
  cmd->add_option("--host-budget", *budget, "--tier disk: host memory for the tier's buffers (default 256MiB)")
      ->check(byte_size());
  cmd->add_option("--io-path", disk->io_path, "--tier disk: auto (default), io_uring or threads")
      ->check(CLI::IsMember({"auto", "io_uring", "threads"}));
  cmd->callback([cmd, options, json, cache_mib, device, tier, disk, state_size, budget] {
    if (*tier == "disk") {
      disk->state_bytes = *parse_byte_size(*state_size);
      disk->host_budget_bytes = *parse_byte_size(*budget);
      disk->device = parse_device(*device);
      // The shared options, where given: the disk tier has defaults of its own.
      if (cmd->count("--tensors") > 0) disk->tensors = options->tensors;
      if (cmd->count("--steps") > 0) disk->steps = options->steps;
      if (cmd->count("--warmup-steps") > 0) disk->warmup_steps = options->warmup_steps;
      const bench::SwapDiskBenchResult result = bench::run_swap_disk_bench(*disk);
      bench::print_result(to_json(result), to_text(result), *json);
      return;
    }
    options->cpu_cache_bytes = *cache_mib << 20;
    options->device = parse_device(*device);
    const bench::SwapBenchResult result = bench::run_swap_bench(*options);
    bench::print_result(to_json(result), to_text(result), *json);
  });
}

}  // namespace stowage::cli
