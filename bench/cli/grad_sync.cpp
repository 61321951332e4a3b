// `stowage bench grad-sync`: data parallelism's gradient averaging with the all-reduces
// overlapped with backward, after it, and not at all, on --nproc local ranks; with
// --zero, the memory per rank and tokens/s of `stowage train` with ZeRO stages 1 and 2
// (zero.h).
#include "zero.h"
#include "cli_numbers.h"
#include "bench_commands.h"
#include "launch_ranks.h"

#include <bench_util.h>
#include <emit.h>
#include <grad_sync_bench.h>

#include <stowage/dist/process_group.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include <stdlib.h>

namespace stowage::cli {
namespace {

struct GradSyncCommand {
  bench::GradSyncBenchConfig config;
  bool zero = false;
  ZeroBenchOptions zero_options;
  int nproc = 2;
  bool json = false;
  bool as_rank = false;
  std::string result_file;  // where rank 0 of --as-rank writes its result
};

// Starts --nproc ranks of this tool and returns rank 0's result.
bench::GradSyncBenchResult run_ranks(const GradSyncCommand& command) {
  std::string scratch = bench::temp_directory() + "/stowage-bench-grad-sync-XXXXXX";
  if (mkdtemp(scratch.data()) == nullptr) throw Error("bench grad-sync: cannot create a scratch directory");
  const std::string result_file = scratch + "/result.json";
  const bench::GradSyncBenchConfig& c = command.config;
  const int status = launch_ranks(
      command.nproc, 0, std::chrono::seconds(10),
      {executable_path(), "grad-sync", "--as-rank", "--result-file", result_file, "--blocks", std::to_string(c.blocks),
       "--width", std::to_string(c.width), "--batch", std::to_string(c.batch), "--steps", std::to_string(c.steps),
       "--bucket-cap-mb", fmt::format("{}", c.bucket_cap_mb), "--threads", std::to_string(c.threads)});
  std::ifstream in(result_file);
  const nlohmann::json result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
  if (status != 0 || result.is_discarded()) {
    throw Error(fmt::format("bench grad-sync: the {}-rank run failed (status {})", command.nproc, status));
  }
  return bench::grad_sync_result_from_json(result);
}

}  // namespace

void add_bench_grad_sync(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "grad-sync", "Gradient averaging over local ranks: all-reduce overlapped with backward, after it, and none");
  auto command = std::make_shared<GradSyncCommand>();
  cmd->add_option("--nproc", command->nproc, "local ranks (processes, c10d Gloo)")
      ->check(integer_in(2, 64))
      ->capture_default_str();
  cmd->add_option("--blocks", command->config.blocks, "Linear + GELU blocks of the MLP")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--width", command->config.width, "the blocks' width")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--batch", command->config.batch, "rows per rank and step")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--steps", command->config.steps, "timed steps per mode")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--bucket-cap-mb", command->config.bucket_cap_mb, "gradient bucket size in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--threads", command->config.threads, "intra-op threads per rank (with --zero too)")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_flag("--zero", command->zero,
                "instead: per rank gradient and optimizer memory, step peak and tokens/s of `stowage train --nproc` "
                "with gradients copied into the buckets, as views of them (ZeRO-1) and sharded (ZeRO-2)");
  cmd->add_option("--train-width", command->zero_options.train.width, "with --zero: the train model's width")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--train-layers", command->zero_options.train.layers, "with --zero: the train model's blocks")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--train-steps", command->zero_options.train.steps, "with --zero: steps per run")
      ->check(integer_in<int64_t>(3))
      ->capture_default_str();
  cmd->add_option("--swap-times", command->zero_options.train.swap_times,
                  "with --zero: optimizer-state swap batches (0: plain AdamW)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--train-device", command->zero_options.train.device,
                  "with --zero: where the ranks train (cpu, cuda, sim: the simulated device of a LibTorch 2.x build)")
      ->capture_default_str();
  cmd->add_option("--rounds", command->zero_options.rounds, "with --zero: runs of each mode, taking turns")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_flag("--json", command->json, "print one JSON object");
  // Internal: how the ranks are run.
  cmd->add_flag("--as-rank", command->as_rank)->group("");
  cmd->add_option("--result-file", command->result_file)->group("");
  cmd->callback([command] {
    if (command->as_rank) {
      const dist::ProcessGroup group = dist::init_process_group_from_env();
      const bench::GradSyncBenchResult result = bench::run_grad_sync_rank(command->config, group);
      if (group.rank() == 0) std::ofstream(command->result_file) << bench::to_json(result).dump() << "\n";
      return;
    }
    if (command->zero) {
      command->zero_options.train.nproc = command->nproc;
      command->zero_options.train.threads = command->config.threads;
      const ZeroBenchResult result = run_zero_bench(command->zero_options);
      bench::print_result(to_json(result), to_text(result), command->json);
      return;
    }
    const bench::GradSyncBenchResult result = run_ranks(*command);
    bench::print_result(bench::to_json(result), bench::to_text(result), command->json);
  });
}

}  // namespace stowage::cli
