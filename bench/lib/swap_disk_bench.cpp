#include "swap_disk_bench.h"

#include "bench_util.h"
#include "emit.h"

#include <stowage/dcp/env.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/optim/swap_optimizer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

namespace stowage::bench {
namespace {

// Targets of the disk tier: step <= 1.2 x the raw write + read; host memory <= budget + 5%.
constexpr double kDiskStepLimit = 1.2;
constexpr double kBudgetSlack = 1.05;

optim::SwapIoPath io_path_of(const std::string& name) {
  for (const auto path : {optim::SwapIoPath::kAuto, optim::SwapIoPath::kIoUring, optim::SwapIoPath::kThreads}) {
    if (name == optim::io_path_name(path)) return path;
  }
  throw InvalidArgument(fmt::format("bench swap: io path '{}' is none of auto, io_uring, threads", name));
}

// SwapDiskBenchResult::raw_read_write_s: `bytes` written to a fresh scratch file in `dir`
// and read back, one buffer of `buffer_bytes` at a time, through the file system's batch
// I/O as the tier's own. Written first: a file system reads blocks never written as zeros
// without touching the disk.
double raw_read_write_seconds(const std::string& dir, int64_t bytes, int64_t buffer_bytes, optim::SwapIoPath path,
                              bool pin) {
  using dcp::IoOp;
  dcp::Env* const env = dcp::Env::posix();
  const auto file = env->create_scratch_file(dir, "stowage-bench-raw", bytes);
  const auto io = env->new_batch_io(path);
  memory::HostAllocOptions options;
  options.pin_memory = pin;
  const at::Tensor buffer = memory::allocate_host({buffer_bytes}, at::kByte, options).fill_(1);
  const auto pass = [&](IoOp op) {
    for (int64_t offset = 0; offset < file->size(); offset += buffer_bytes) {
      const int64_t chunk = std::min(buffer_bytes, file->size() - offset);
      io->run(op, {{file.get(), offset, static_cast<char*>(buffer.data_ptr()), chunk}});
    }
  };
  return seconds([&] {
    pass(IoOp::kWrite);
    pass(IoOp::kRead);
  });
}

}  // namespace

SwapDiskBenchResult run_swap_disk_bench(const SwapDiskBenchOptions& options) {
  const int64_t params_total = options.state_bytes / 8;
  if (options.tensors <= 0 || params_total < options.tensors || options.steps <= 0 || options.warmup_steps < 0 ||
      options.host_budget_bytes <= 0) {
    throw InvalidArgument(fmt::format(
        "bench swap --tier disk: need 0 < tensors ({}) <= state_bytes / 8 ({}), steps ({}) > 0, warmup_steps ({}) "
        ">= 0 and a positive host budget ({})",
        options.tensors, params_total, options.steps, options.warmup_steps, options.host_budget_bytes));
  }
  const optim::SwapIoPath io_path = io_path_of(options.io_path);
  SwapDiskBenchResult result;
  result.device = options.device.str();
  result.dir = options.dir.empty() ? temp_directory() : options.dir;
  result.host_budget_bytes = options.host_budget_bytes;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto on_device = torch::TensorOptions().device(options.device);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < options.tensors; ++i) {
    auto p = torch::rand({params_total / options.tensors}, on_device).sub_(0.5).requires_grad_();
    p.mutable_grad() = torch::rand_like(p).sub_(0.5);
    params.push_back(p);
    result.state_bytes += 2 * static_cast<int64_t>(p.nbytes());
  }
  const auto adamw = [&] { return std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3)); };

  // As in the host tier's benchmark, every optimizer lives for the whole run and the timed
  // steps go round-robin, so that each configuration meets the same machine state.
  auto plain = adamw();
  plain->step();
  std::vector<c10::intrusive_ptr<optim::SwapOptimizer>> swaps;
  for (const int64_t swap_times : options.swap_times) {
    const int64_t before = memory::memory_allocated(options.device);
    swaps.push_back(optim::swap_optimizer(adamw(), optim::SwapOptimizerConfig()
                                                       .swap_times(swap_times)
                                                       .swap_dir(result.dir)
                                                       .io_path(io_path)
                                                       .buffer_count(options.buffer_count)
                                                       .host_budget_bytes(options.host_budget_bytes)));
    swaps.back()->step();  // lays the states out in the files
    result.runs.push_back({swap_times, 0, 0, memory::memory_allocated(options.device) - before});
  }
  std::vector<RoundRobinStep> configurations = {clocked_step([&] { plain->step(); }, options.device)};
  for (auto& swap : swaps) configurations.push_back(clocked_step([&swap] { swap->step(); }, options.device));
  const std::vector<double> medians = median_seconds_in_rounds(configurations, options.warmup_steps, options.steps);
  result.plain_step_s = medians[0];
  plain.reset();
  for (size_t i = 0; i < swaps.size(); ++i) {
    const optim::DiskTierStats stats = swaps[i]->disk_stats();
    result.runs[i].step_s = medians[i + 1];
    result.runs[i].peak_host_tier_bytes = stats.peak_host_bytes;
    result.io_path = optim::io_path_name(stats.io_path);
    result.direct_io = stats.direct_io;
  }
  const int64_t buffer_bytes =
      swaps.empty() ? options.host_budget_bytes / options.buffer_count : swaps.front()->disk_stats().buffer_bytes;
  swaps.clear();
  result.raw_read_write_s =
      raw_read_write_seconds(result.dir, result.state_bytes, buffer_bytes, io_path, !options.device.is_cpu());
  return result;
}

namespace {

// A row a run: its figures and the targets', which the text shows as ratios.
Table runs_table(const SwapDiskBenchResult& result) {
  Table table;
  for (const SwapDiskRun& run : result.runs) {
    const double ratio = run.step_s / result.raw_read_write_s;
    const bool step_met = run.step_s <= kDiskStepLimit * result.raw_read_write_s;
    const bool budget_met = run.peak_host_tier_bytes <= kBudgetSlack * result.host_budget_bytes;
    table.add(Row()
                  .field("swap_times", run.swap_times)
                  .field("step_s", run.step_s, "{:.3f}")
                  .json("step_vs_raw_read_write", ratio)
                  .json("step_target_met", step_met)
                  .text("step/raw io", fmt::format("{:.2f} ({})", ratio, step_met ? "met" : "NOT"))
                  .json("peak_host_tier_bytes", run.peak_host_tier_bytes)
                  .json("host_budget_target_met", budget_met)
                  .text("host tier (MiB)",
                        fmt::format("{:.1f} ({})", run.peak_host_tier_bytes / 1048576.0, budget_met ? "met" : "NOT"))
                  .field("resident_between_steps_bytes", run.resident_between_steps_bytes, "{}", "between (B)"));
  }
  return table;
}

}  // namespace

nlohmann::json to_json(const SwapDiskBenchResult& result) {
  return {{"tier", "disk"},
          {"device", result.device},
          {"dir", result.dir},
          {"state_bytes", result.state_bytes},
          {"host_budget_bytes", result.host_budget_bytes},
          {"io_path", result.io_path},
          {"direct_io", result.direct_io},
          {"raw_read_write_s", result.raw_read_write_s},
          {"plain_step_s", result.plain_step_s},
          {"runs", runs_table(result).json()}};
}

std::string to_text(const SwapDiskBenchResult& result) {
  std::string out = fmt::format(
      "AdamW with {:.0f} MiB of state on {}, swapped to {} through {}{} with {:.0f} MiB of host buffers; plain step "
      "(state resident) {:.3f} s; writing and reading the state raw takes {:.3f} s\n",
      result.state_bytes / 1048576.0, result.device, result.dir, result.io_path,
      result.direct_io ? " (O_DIRECT)" : " (page cache)", result.host_budget_bytes / 1048576.0, result.plain_step_s,
      result.raw_read_write_s);
  out += runs_table(result).text();
  out += fmt::format("targets: step <= {} x raw write + read; host tier <= budget + 5%; between = 0\n", kDiskStepLimit);
  return out;
}

}  // namespace stowage::bench
