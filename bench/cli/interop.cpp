#include "cli_numbers.h"
#include "bench_commands.h"

#include <emit.h>
#include <interop_bench.h>

namespace stowage::cli {

void add_bench_interop(CLI::App& bench) {
  auto options = std::make_shared<bench::InteropBenchOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "interop", "safetensors export and import of a checkpoint against a plain copy of its bytes, and their memory");
  cmd->add_option("--size-mib", options->size_mib, "checkpoint size (default 1024)")
      ->check(positive_integer<int64_t>());
  cmd->add_option("--tensors", options->tensors, "number of float tensors (default 64)")
      ->check(positive_integer<int64_t>());
  cmd->add_option("--dir", options->dir, "scratch directory (default: the system temp directory)");
  cmd->add_flag("--json", *json, "print the figures as JSON");
  cmd->callback([options, json] {
    const bench::InteropBenchResult result = bench::run_interop_bench(*options);
    bench::print_result(to_json(result), to_text(result), *json);
  });
}

}  // namespace stowage::cli
