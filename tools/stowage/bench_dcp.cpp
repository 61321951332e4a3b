#include "commands.h"

#include "dcp_bench.h"

#include <iostream>

namespace stowage::cli {

void add_bench_dcp(CLI::App& bench) {
  CLI::App* dcp = bench.add_subcommand("dcp", "Checkpoint staging, save and load against memcpy, the disk and torch::save");
  auto options = std::make_shared<bench::DcpBenchOptions>();
  auto json = std::make_shared<bool>(false);
  dcp->add_option("--size-mib", options->size_mib, "size of the state dict in MiB (64 tensors)")
      ->check(CLI::PositiveNumber);
  dcp->add_option("--dir", options->dir, "scratch directory (default: the system temp directory)");
  dcp->add_flag("--json", *json, "print one JSON object");
  dcp->callback([options, json] {
    const bench::DcpBenchResult result = bench::run_dcp_bench(*options);
    if (*json) {
      std::cout << bench::to_json(result).dump() << "\n";
    } else {
      std::cout << bench::format_report(result);
    }
  });
}

}  // namespace stowage::cli
