#include "activation_train.h"

#include "train_run.h"

#include <bench_util.h>
#include <emit.h>

#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace stowage::cli {
namespace {

constexpr int64_t kActivationWarmupSteps = 2;
// Issue 26's goals: selective recompute's peak at most half of none's, at most a third
// of whole-block recompute's time overhead; offload's peak at most a third of the same
// segments' without it.
constexpr double kSelectivePeakShare = 0.5;
constexpr double kSelectiveOverheadShare = 1.0 / 3;
constexpr double kOffloadPeakShare = 1.0 / 3;

// The simulator's step time is no device's: its runs give memory only.
bool timed_device(const std::string& device) {
  return device.rfind("sim", 0) != 0;
}

std::string whole_mode_name(int64_t segments) {
  return fmt::format("whole, {} segments", segments);
}

std::string offloaded_mode_name(int64_t segments) {
  return whole_mode_name(segments) + ", inputs offloaded";
}

bool is_selective_mode(const std::string& mode) {
  return mode == "attention core" || mode == "mlp";
}

// A way of checkpointing the model: the flags it sets on `stowage train`.
struct CheckpointingMode {
  std::string name;
  int64_t recompute_segments = 0;
  std::string selective_recompute;
  bool offload_checkpoint_inputs = false;
  int64_t budget_bytes = 0;
};

std::vector<CheckpointingMode> checkpointing_modes(const TrainOptions& train) {
  const auto layers = train.layers;
  const auto root = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(layers))));
  std::vector<CheckpointingMode> modes = {{"none"},
                                          {whole_mode_name(root) + " (sqrt n)", root},
                                          {whole_mode_name(layers), layers},
                                          {"attention core", 0, "attention-core"},
                                          {"mlp", 0, "mlp"}};
  if (train.device != "cpu") modes.push_back({offloaded_mode_name(layers), layers, "", true});  // nothing on the CPU
  return modes;
}

// A budget `share` of the way from `least` (the least peak of the fixed modes) to
// `unplanned` (none's), so that each of the three is one some plan can meet.
CheckpointingMode budget_checkpointing_mode(double share, int64_t least, int64_t unplanned) {
  const auto budget = least + static_cast<int64_t>(share * static_cast<double>(unplanned - least));
  return {fmt::format("budget {:.0f}% ({:.1f} MiB)", 100 * share, static_cast<double>(budget) / (1 << 20)), 0, "",
          false, budget};
}

// One `stowage train` run of `mode` at `seq_len`.
ActivationTrainBenchRow run_checkpointing_mode(const ActivationTrainBenchOptions& o, const CheckpointingMode& mode,
                                               int64_t seq_len, const bench::Scratch& scratch) {
  TrainOptions train = o.train;
  train.run_dir = scratch.sub("run");
  train.seq_len = seq_len;
  train.recompute_segments = mode.recompute_segments;
  train.selective_recompute = mode.selective_recompute;
  train.offload_checkpoint_inputs = mode.offload_checkpoint_inputs;
  if (mode.budget_bytes > 0) train.activation_budget = std::to_string(mode.budget_bytes);
  const TrainRecords records = run_train_or_throw(
      train, scratch.sub("run.log"),
      fmt::format("bench activation --train-model: `stowage train` ({}, seq {})", mode.name, seq_len));
  ActivationTrainBenchRow row;
  row.seq_len = seq_len;
  row.mode = mode.name;
  row.budget_bytes = mode.budget_bytes;
  if (mode.budget_bytes > 0) row.plan = records.activation_checkpointing;
  std::vector<double> step_s;
  for (const train::StepRecord& step : records.steps) {
    row.peak_activation_bytes = std::max(row.peak_activation_bytes, step.peak_activation_bytes);
    if (step.step > kActivationWarmupSteps) step_s.push_back(step.step_s);
  }
  if (step_s.empty()) {
    throw Error(fmt::format("bench activation --train-model: `stowage train` ({}) logged no step after the first {}",
                            mode.name, kActivationWarmupSteps));
  }
  row.step_s = bench::median(step_s);
  return row;
}

// Every mode at one sequence length: the fixed ones first (the budgets lie between their
// peaks), then the budgets, then each further round in an order that rotates; times are
// the median over the rounds.
std::vector<ActivationTrainBenchRow> run_modes_at(const ActivationTrainBenchOptions& o, int64_t seq_len,
                                                  const bench::Scratch& scratch) {
  std::vector<CheckpointingMode> modes = checkpointing_modes(o.train);
  std::vector<std::vector<ActivationTrainBenchRow>> runs;
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const CheckpointingMode& mode : modes) {
    runs.push_back({run_checkpointing_mode(o, mode, seq_len, scratch)});
    least = std::min(least, runs.back().front().peak_activation_bytes);
  }
  const int64_t unplanned = runs.front().front().peak_activation_bytes;
  for (const double share : o.budget_shares) {
    modes.push_back(budget_checkpointing_mode(share, least, unplanned));
    runs.push_back({run_checkpointing_mode(o, modes.back(), seq_len, scratch)});
  }
  for (int round = 1; round < o.rounds; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t m = (k + static_cast<size_t>(round)) % modes.size();
      runs[m].push_back(run_checkpointing_mode(o, modes[m], seq_len, scratch));
    }
  }
  std::vector<ActivationTrainBenchRow> rows;
  for (const std::vector<ActivationTrainBenchRow>& mode_runs : runs) {
    ActivationTrainBenchRow row = mode_runs.front();
    std::vector<double> step_s;
    for (const ActivationTrainBenchRow& run : mode_runs) {
      step_s.push_back(run.step_s);
      row.peak_activation_bytes = std::max(row.peak_activation_bytes, run.peak_activation_bytes);
    }
    row.step_s = bench::median(step_s);
    rows.push_back(row);
  }
  return rows;
}

double mebibytes(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

const ActivationTrainBenchRow* find_activation_row(const ActivationTrainBenchResult& r, int64_t seq_len,
                                                   const std::string& prefix) {
  for (const ActivationTrainBenchRow& row : r.rows) {
    if (row.seq_len == seq_len && row.mode.rfind(prefix, 0) == 0) return &row;
  }
  return nullptr;
}

// What a row's peak is asked to stay under (0: nothing): its budget, or the goal of its kind.
int64_t peak_target_bytes(const ActivationTrainBenchResult& r, const ActivationTrainBenchRow& row) {
  if (row.budget_bytes > 0) return row.budget_bytes;
  const auto share_of = [&](const std::string& mode, double share) {
    return static_cast<int64_t>(share *
                                static_cast<double>(find_activation_row(r, row.seq_len, mode)->peak_activation_bytes));
  };
  if (is_selective_mode(row.mode)) return share_of("none", kSelectivePeakShare);
  if (row.mode == offloaded_mode_name(r.options.train.layers)) {
    return share_of(whole_mode_name(r.options.train.layers), kOffloadPeakShare);
  }
  return 0;
}

// Whole-block recompute's step time overhead over none's at √n segments, in seconds; one
// within the noise of two runs (a few percent) would divide nothing, so at least 2%.
double whole_overhead_s(const ActivationTrainBenchResult& r, int64_t seq_len) {
  const double none = find_activation_row(r, seq_len, "none")->step_s;
  return std::max(find_activation_row(r, seq_len, "whole")->step_s - none, 0.02 * none);
}

// What a row's step is asked to stay under (0: nothing): selective recompute's goal, on a
// device whose time is measured.
double step_target_s(const ActivationTrainBenchResult& r, const ActivationTrainBenchRow& row) {
  if (!timed_device(r.options.train.device) || !is_selective_mode(row.mode)) return 0;
  return find_activation_row(r, row.seq_len, "none")->step_s +
         kSelectiveOverheadShare * whole_overhead_s(r, row.seq_len);
}

// The goals of issue 26 at one sequence length, each a verdict over the measured rows.
struct ActivationGoals {
  nlohmann::json json = nlohmann::json::array();
  std::string text;
};

ActivationGoals activation_goals_at(const ActivationTrainBenchResult& r, int64_t seq_len) {
  ActivationGoals goals;
  const bool timed = timed_device(r.options.train.device);
  const auto& none = *find_activation_row(r, seq_len, "none");
  const auto overhead = [&none](const ActivationTrainBenchRow& row) { return row.step_s / none.step_s - 1; };
  const auto add = [&](const std::string& goal, double value, double limit, const std::string& detail) {
    goals.json.push_back(
        {{"seq_len", seq_len}, {"goal", goal}, {"value", value}, {"limit", limit}, {"met", value <= limit}});
    goals.text += fmt::format("  seq {}: {}: {:.2f} (limit {:.2f}) {}; {}\n", seq_len, goal, value, limit,
                              bench::met_text(value <= limit), detail);
  };
  const auto peak_over = [](const ActivationTrainBenchRow& row, const ActivationTrainBenchRow& reference) {
    return static_cast<double>(row.peak_activation_bytes) / static_cast<double>(reference.peak_activation_bytes);
  };
  const ActivationTrainBenchRow& whole = *find_activation_row(r, seq_len, "whole");
  for (const char* selective : {"attention core", "mlp"}) {
    const ActivationTrainBenchRow& row = *find_activation_row(r, seq_len, selective);
    add(fmt::format("{}: peak / none's", selective), peak_over(row, none), kSelectivePeakShare, "");
    if (!timed) continue;
    add(fmt::format("{}: recompute overhead / whole sqrt(n)'s", selective),
        (row.step_s - none.step_s) / whole_overhead_s(r, seq_len), kSelectiveOverheadShare,
        fmt::format("{:+.0f}% against {:+.0f}%", 100 * overhead(row), 100 * overhead(whole)));
  }
  const int64_t layers = r.options.train.layers;
  if (const ActivationTrainBenchRow* offloaded = find_activation_row(r, seq_len, offloaded_mode_name(layers))) {
    const ActivationTrainBenchRow& kept = *find_activation_row(r, seq_len, whole_mode_name(layers));
    add("offload: peak / without", peak_over(*offloaded, kept), kOffloadPeakShare,
        fmt::format("{:.1f} MiB against {:.1f} MiB", mebibytes(offloaded->peak_activation_bytes),
                    mebibytes(kept.peak_activation_bytes)));
  }
  for (const ActivationTrainBenchRow& row : r.rows) {
    if (row.seq_len != seq_len || row.budget_bytes == 0) continue;
    add(fmt::format("{}: peak / budget", row.mode),
        static_cast<double>(row.peak_activation_bytes) / static_cast<double>(row.budget_bytes), 1.0,
        timed ? fmt::format("{} picked, {:+.0f}% step time", row.plan, 100 * overhead(row))
              : fmt::format("{} picked", row.plan));
  }
  return goals;
}

bench::Table activation_rows_table(const ActivationTrainBenchResult& r) {
  bench::Table table;
  for (const ActivationTrainBenchRow& row : r.rows) {
    const ActivationTrainBenchRow& none = *find_activation_row(r, row.seq_len, "none");
    bench::Row line;
    line.field("seq_len", row.seq_len, "{}", "seq")
        .field("mode", row.mode)
        .json("peak_activation_bytes", row.peak_activation_bytes)
        .text("activation peak", fmt::format("{:.1f} MiB", mebibytes(row.peak_activation_bytes)))
        .field("peak_vs_none",
               static_cast<double>(row.peak_activation_bytes) / static_cast<double>(none.peak_activation_bytes),
               "{:.2f}x", "vs none")
        .field("step_s", row.step_s, "{:.4f}", "step s")
        .field("step_overhead_vs_none", row.step_s / none.step_s - 1, "{:+.2f}", "overhead")
        .json("budget_bytes", row.budget_bytes)
        .json("peak_target_bytes", peak_target_bytes(r, row))
        .json("step_target_s", step_target_s(r, row))
        .field("plan", row.plan.empty() ? "-" : row.plan);
    table.add(std::move(line));
  }
  return table;
}

}  // namespace

TrainOptions ActivationTrainBenchOptions::default_run() {
  TrainOptions run;
  run.layers = 8;
  run.width = 128;
  run.batch = 8;
  run.threads = 1;  // two threads on this machine's two cores make step times vary by 2x
  run.steps = 6;
  run.swap_times = 0;
  run.ckpt_every = 0;
  run.log_every = 1000000;  // no progress lines: the figures are the metrics'
  return run;
}

ActivationTrainBenchResult run_activation_train_bench(const ActivationTrainBenchOptions& o) {
  if (o.train.steps <= kActivationWarmupSteps || o.rounds < 1 || o.seq_lens.empty()) {
    throw InvalidArgument(fmt::format(
        "bench activation --train-model: needs more than {} --train-steps, a round and a sequence length at least",
        kActivationWarmupSteps));
  }
  for (const double share : o.budget_shares) {
    if (!(share >= 0 && share <= 1)) {
      throw InvalidArgument(
          fmt::format("bench activation --train-model: a budget share of {} is not in [0, 1]", share));
    }
  }
  const bench::Scratch scratch(bench::temp_directory(), "activation-train");
  ActivationTrainBenchResult result;
  result.options = o;
  for (const int64_t seq_len : o.seq_lens) {
    for (ActivationTrainBenchRow& row : run_modes_at(o, seq_len, scratch)) result.rows.push_back(std::move(row));
  }
  return result;
}

nlohmann::json to_json(const ActivationTrainBenchResult& r) {
  nlohmann::json goals = nlohmann::json::array();
  for (const int64_t seq_len : r.options.seq_lens) {
    for (auto& goal : activation_goals_at(r, seq_len).json) goals.push_back(std::move(goal));
  }
  nlohmann::json out =
      train_options_json(r.options.train, {"device", "layers", "width", "heads", "batch", "threads", "steps"});
  out["benchmark"] = "activation_train";
  out["timed"] = timed_device(r.options.train.device);
  out["rounds"] = r.options.rounds;
  out["rows"] = activation_rows_table(r).json();
  out["goals"] = goals;
  return out;
}

std::string to_text(const ActivationTrainBenchResult& r) {
  std::string text = fmt::format(
      "activation checkpointing of `stowage train --device {}` ({} blocks, width {}, {} heads, batch {}), {} "
      "thread(s), median step of {} steps after {} of warm-up, {} round(s)\n",
      r.options.train.device, r.options.train.layers, r.options.train.width, r.options.train.heads,
      r.options.train.batch, r.options.train.threads, r.options.train.steps - kActivationWarmupSteps,
      kActivationWarmupSteps, r.options.rounds);
  if (!timed_device(r.options.train.device)) text += "  the simulator's step times are no device's: read its peaks\n";
  text += activation_rows_table(r).text("  ");
  for (const int64_t seq_len : r.options.seq_lens) text += activation_goals_at(r, seq_len).text;
  return text;
}

}  // namespace stowage::cli
