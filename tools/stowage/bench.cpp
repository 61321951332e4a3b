#include "commands.h"

#include <activation_bench.h>
#include <dcp_bench.h>
#include <swap_bench.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace stowage::cli {
namespace {

// One line of the side-by-side table: a measured ratio against its target.
struct TargetRow {
  std::string benchmark;
  std::string figure;
  double value = 0;
  std::string target;
  bool met = false;
};

std::vector<TargetRow> rows_of(const bench::DcpBenchResult& r) {
  return {
      {"dcp", "stage_cached / memcpy", r.stage_cached_gbps / r.memcpy_gbps, ">= 0.8",
       r.stage_cached_gbps >= 0.8 * r.memcpy_gbps},
      {"dcp", "save / raw_write", r.save_gbps / r.raw_write_gbps, ">= 0.9", r.save_gbps >= 0.9 * r.raw_write_gbps},
      {"dcp", "save / torch_save", r.save_gbps / r.torch_save_gbps, ">= 2", r.save_gbps >= 2 * r.torch_save_gbps},
      {"dcp", "load / torch_load", r.load_gbps / r.torch_load_gbps, ">= 2", r.load_gbps >= 2 * r.torch_load_gbps},
      {"dcp", "async_block / stage", r.async_block_s / r.stage_s, "<= 1.1", r.async_block_s <= 1.1 * r.stage_s},
  };
}

std::vector<TargetRow> rows_of(const bench::ActivationBenchResult& r) {
  const std::string at = fmt::format("at {} segments", r.sqrt_segments);
  return {
      {"activation", "activations / plain " + at, r.activation_ratio(), "<= 0.333", r.memory_target_met()},
      {"activation", "step / plain " + at, r.step_ratio(), "<= 1.4", r.time_target_met()},
  };
}

std::vector<TargetRow> rows_of(const bench::SwapBenchResult& r) {
  std::vector<TargetRow> rows;
  for (const auto& run : r.runs) {
    const double limit = (2.0 / run.swap_times + 0.05) * r.plain_state_bytes;
    rows.push_back({"swap", fmt::format("step / plain, swap_times {}", run.swap_times), run.step_s / r.plain_step_s,
                    "<= 1.5", run.step_s <= 1.5 * r.plain_step_s});
    rows.push_back({"swap", fmt::format("peak resident / limit, swap_times {}", run.swap_times),
                    run.peak_resident_during_step_bytes / limit, "<= 1", run.peak_resident_during_step_bytes <= limit});
  }
  return rows;
}

// Every benchmark with its default size, then one table of all targets.
void run_all(bool as_json) {
  const auto dcp = bench::run_dcp_bench(bench::DcpBenchOptions());
  const auto activation = bench::run_activation_bench(bench::ActivationBenchConfig());
  const auto swap = bench::run_swap_bench(bench::SwapBenchOptions());
  std::vector<TargetRow> rows = rows_of(dcp);
  for (auto& row : rows_of(activation)) rows.push_back(row);
  for (auto& row : rows_of(swap)) rows.push_back(row);
  if (as_json) {
    nlohmann::json targets = nlohmann::json::array();
    for (const auto& row : rows) {
      targets.push_back({{"benchmark", row.benchmark},
                         {"figure", row.figure},
                         {"value", row.value},
                         {"target", row.target},
                         {"met", row.met}});
    }
    fmt::print("{}\n", nlohmann::json{{"dcp", bench::to_json(dcp)},
                                      {"activation", bench::to_json(activation)},
                                      {"swap", bench::to_json(swap)},
                                      {"targets", targets}}
                           .dump(2));
    return;
  }
  fmt::print("{:<11} {:<44} {:>8}  {:<9} {}\n", "benchmark", "figure", "value", "target", "");
  for (const auto& row : rows) {
    fmt::print("{:<11} {:<44} {:>8.3f}  {:<9} {}\n", row.benchmark, row.figure, row.value, row.target,
               row.met ? "met" : "NOT met");
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Run one benchmark, or all of them (one table) without a name");
  auto json = std::make_shared<bool>(false);
  bench->add_flag("--json", *json, "with no benchmark named: print every figure as JSON");
  add_bench_activation(*bench);
  add_bench_swap(*bench);
  add_bench_dcp(*bench);
  add_bench_grad_sync(*bench);
  add_bench_interop(*bench);
  bench->callback([bench, json] {
    if (bench->get_subcommands().empty()) run_all(*json);
  });
}

}  // namespace stowage::cli
