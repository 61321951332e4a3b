#include "cli_numbers.h"
#include "bench_commands.h"
#include "device_option.h"
#include "launch_ranks.h"

#include "train_model.h"

#include "dcp_bench.h"
#include "emit.h"
#include "python_peer.h"
#include "step_snapshot_bench.h"

#include <stowage/dist/process_group.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

namespace stowage::cli {
namespace {

// The distributed save measurement with `nproc` ranks, each a process running this
// tool as a rank; returns the aggregate GB/s rank 0 reports.
double distributed_save_gbps(const bench::DcpBenchOptions& options, int nproc) {
  const std::string parent = options.dir.empty() ? std::filesystem::temp_directory_path().string() : options.dir;
  std::string scratch = parent + "/stowage-bench-dcp-ranks-XXXXXX";
  if (mkdtemp(scratch.data()) == nullptr)
    throw Error(fmt::format("bench dcp: cannot create a directory in '{}'", parent));
  const std::string result_file = scratch + "/result";
  const int status =
      launch_ranks(nproc, 0, std::chrono::seconds(10),
                   {executable_path(), "dcp", "--as-rank", "--size-mib", std::to_string(options.size_mib), "--dir",
                    scratch + "/checkpoint", "--result-file", result_file});
  std::ifstream in(result_file);
  double gbps = 0;
  const bool read = static_cast<bool>(in >> gbps);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
  if (status != 0 || !read) throw Error(fmt::format("bench dcp: the {}-rank save failed (status {})", nproc, status));
  return gbps;
}

}  // namespace

void add_bench_dcp(CLI::App& bench) {
  CLI::App* dcp =
      bench.add_subcommand("dcp", "Checkpoint staging, save and load against memcpy, the disk and torch::save");
  auto options = std::make_shared<bench::DcpBenchOptions>();
  auto json = std::make_shared<bool>(false);
  auto nproc = std::make_shared<int>(0);
  auto as_rank = std::make_shared<bool>(false);
  auto result_file = std::make_shared<std::string>();
  dcp->add_option("--size-mib", options->size_mib, "size of the state dict in MiB (64 tensors)")
      ->check(integer_in<int64_t>(1, std::numeric_limits<int64_t>::max() >> 20));
  dcp->add_option("--dir", options->dir, "scratch directory (default: the system temp directory)");
  dcp->add_option("--nproc", *nproc, "also save the state sharded over this many local ranks (c10d Gloo)")
      ->check(integer_in(1, 64));
  auto device = std::make_shared<std::string>();
  CLI::Option* device_option =
      dcp->add_option("--device", *device,
                      "instead: stage a state dict on this device (e.g. cuda:0) against the device-to-host copy limit, "
                      "and time async_save's block");
  dcp->add_flag("--peer", options->peer,
                "also measure PyTorch DCP (torch.distributed.checkpoint, the torch wheel's Python) on the same state "
                "dict, taking turns with stowage")
      ->excludes(device_option);
  auto step_snapshot = std::make_shared<bool>(false);
  dcp->add_flag("--step-snapshot", *step_snapshot,
                "instead: what copying the buffers the next forward writes costs async_save, for the train model "
                "and a BatchNorm-heavy one")
      ->excludes(device_option);
  dcp->add_flag("--json", *json, "print one JSON object");
  // Internal: how --nproc runs each rank.
  dcp->add_flag("--as-rank", *as_rank)->group("");
  dcp->add_option("--result-file", *result_file)->group("");
  dcp->callback([options, json, nproc, as_rank, result_file, device, step_snapshot] {
    if (*step_snapshot) {
      const std::vector<bench::StepSnapshotResult> results = {
          bench::run_step_snapshot_bench("train model", LanguageModel(LanguageModelOptions()).ptr(), options->dir),
          bench::run_step_snapshot_bench("256 x BatchNorm1d(1024)", bench::batch_norm_heavy_model(), options->dir)};
      nlohmann::json out = nlohmann::json::array();
      std::string text;
      for (const auto& result : results) {
        out.push_back(bench::to_json(result));
        text += bench::to_text(result);
      }
      bench::print_result(out, text, *json);
      return;
    }
    if (!device->empty()) {
      const nlohmann::json figures = bench::to_json(bench::run_device_staging_bench(*options, parse_device(*device)));
      bench::print_result(figures, figures.dump(2), *json);  // its text: the figures, indented
      return;
    }
    if (options->peer && !bench::python_peer_available()) throw Error(bench::python_peer_unavailable_reason());
    if (*as_rank) {
      const stowage::dist::ProcessGroup group = stowage::dist::init_process_group_from_env();
      const double gbps = bench::run_dcp_rank_save_bench(*options, options->dir, group);
      if (group.rank() == 0) std::ofstream(*result_file) << gbps << "\n";
      return;
    }
    const bench::DcpBenchResult result = bench::run_dcp_bench(*options);
    nlohmann::json out = bench::to_json(result);
    std::string text = bench::to_text(result);
    if (*nproc > 0) {
      out["ranks"] = *nproc;
      out["aggregate_save_gbps"] = distributed_save_gbps(*options, *nproc);
      text += fmt::format("  {} ranks (processes, c10d Gloo): aggregate save {:.2f} GB/s\n", *nproc,
                          out["aggregate_save_gbps"].get<double>());
    }
    bench::print_result(out, text, *json);
  });
}

}  // namespace stowage::cli
