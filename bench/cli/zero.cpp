#include "zero.h"

#include "train_model.h"
#include "train_run.h"

#include <bench_util.h>
#include <emit.h>

#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace stowage::cli {
namespace {

constexpr int64_t kZeroWarmupSteps = 2;

struct ZeroMode {
  const char* name;
  int zero_stage;
  bool views;
};
constexpr std::array<ZeroMode, 3> kZeroModes = {
    {{"zero1-copies", 1, false}, {"zero1-views", 1, true}, {"zero2", 2, true}}};

// One `stowage train` run of `mode`: its figures, tokens/s the median of its timed steps.
ZeroBenchRow run_zero_mode(const ZeroBenchOptions& o, const ZeroMode& mode, const bench::Scratch& scratch) {
  TrainOptions train = o.train;
  train.run_dir = scratch.sub(mode.name);
  train.zero_stage = mode.zero_stage;
  train.gradient_as_bucket_view = mode.views;
  const TrainRecords records =
      run_train_or_throw(train, scratch.sub(std::string(mode.name) + ".log"),
                         fmt::format("bench grad-sync --zero: `stowage train` ({})", mode.name));
  ZeroBenchRow row;
  row.mode = mode.name;
  std::vector<double> tokens_per_s;
  for (const train::StepRecord& step : records.steps) {
    row.gradient_bytes = step.gradient_bytes;
    row.optimizer_bytes = step.optimizer_resident_bytes;
    row.peak_step_bytes = std::max(row.peak_step_bytes, step.peak_step_bytes);
    if (step.step > kZeroWarmupSteps) tokens_per_s.push_back(step.tokens_per_s);
  }
  if (tokens_per_s.empty()) {
    throw Error(fmt::format("bench grad-sync --zero: `stowage train` ({}) logged no step after the first {}", mode.name,
                            kZeroWarmupSteps));
  }
  row.tokens_per_s = bench::median(tokens_per_s);
  return row;
}

int64_t model_parameter_bytes(const ZeroBenchOptions& o) {
  LanguageModelOptions model_options;
  model_options.layers = o.train.layers;
  model_options.width = o.train.width;
  int64_t bytes = 0;
  for (const auto& p : LanguageModel(model_options)->parameters()) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

}  // namespace

TrainOptions zero_bench_run() {
  TrainOptions run;
  run.nproc = 2;
  run.threads = 1;
  run.swap_times = 0;
  run.steps = 12;
  run.ckpt_every = 0;
  run.log_every = 1000000;  // no progress lines: the figures are the metrics'
  return run;
}

double zero2_gradient_limit(const ZeroBenchResult& r) {
  const double bucket = std::min<double>(dist::GradientReducerOptions().bucket_cap_mb() * (1 << 20), r.parameter_bytes);
  return static_cast<double>(r.rows.front().gradient_bytes) / r.options.train.nproc + bucket;
}

ZeroBenchResult run_zero_bench(const ZeroBenchOptions& o) {
  if (o.train.steps <= kZeroWarmupSteps || o.rounds < 1) {
    throw InvalidArgument(
        fmt::format("bench grad-sync --zero: needs more than {} --train-steps and a round at least", kZeroWarmupSteps));
  }
  const bench::Scratch scratch(bench::temp_directory(), "stowage-bench-zero");
  std::array<std::vector<ZeroBenchRow>, kZeroModes.size()> runs;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < kZeroModes.size(); ++k) {  // the order rotates, so no mode always goes first
      const size_t m = (k + static_cast<size_t>(round)) % kZeroModes.size();
      runs[m].push_back(run_zero_mode(o, kZeroModes[m], scratch));
    }
  }
  ZeroBenchResult result;
  result.options = o;
  result.parameter_bytes = model_parameter_bytes(o);
  for (const std::vector<ZeroBenchRow>& mode_runs : runs) {
    ZeroBenchRow row = mode_runs.back();  // the memory figures are the same in every round
    std::vector<double> tokens_per_s;
    for (const ZeroBenchRow& run : mode_runs) {
      tokens_per_s.push_back(run.tokens_per_s);
      row.peak_step_bytes = std::max(row.peak_step_bytes, run.peak_step_bytes);
    }
    row.tokens_per_s = bench::median(tokens_per_s);
    result.rows.push_back(row);
  }
  return result;
}

namespace {

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// A row a mode: its figures, and beside them in the JSON its ratios to the copies' row.
bench::Table rows_table(const ZeroBenchResult& r) {
  const ZeroBenchRow& copies = r.rows.front();
  bench::Table table;
  for (const ZeroBenchRow& row : r.rows) {
    const double tokens_vs_copies = row.tokens_per_s / copies.tokens_per_s;
    table.add(bench::Row()
                  .field("mode", row.mode)
                  .json("gradient_bytes", row.gradient_bytes)
                  .text("gradients", fmt::format("{:.1f} MiB", mib(row.gradient_bytes)))
                  .json("optimizer_bytes", row.optimizer_bytes)
                  .text("optimizer", fmt::format("{:.1f} MiB", mib(row.optimizer_bytes)))
                  .json("peak_step_bytes", row.peak_step_bytes)
                  .text("step peak", fmt::format("{:.1f} MiB", mib(row.peak_step_bytes)))
                  .field("tokens_per_s", row.tokens_per_s, "{:.0f}", "tokens/s")
                  .field("tokens_per_s_vs_copies", tokens_vs_copies, "{:.2f}x", "vs copies")
                  .json("gradient_bytes_vs_copies", static_cast<double>(row.gradient_bytes) / copies.gradient_bytes));
  }
  return table;
}

}  // namespace

nlohmann::json to_json(const ZeroBenchResult& r) {
  const double zero2_vs_limit = static_cast<double>(r.rows.back().gradient_bytes) / zero2_gradient_limit(r);
  nlohmann::json out =
      train_options_json(r.options.train, {"width", "layers", "swap_times", "device", "steps", "threads"});
  out["benchmark"] = "zero";
  out["ranks"] = r.options.train.nproc;
  out["rounds"] = r.options.rounds;
  out["parameter_bytes"] = r.parameter_bytes;
  out["rows"] = rows_table(r).json();
  out["zero2_gradients_vs_limit"] = zero2_vs_limit;
  return out;
}

std::string to_text(const ZeroBenchResult& r) {
  std::string text = fmt::format(
      "data-parallel memory per rank (rank 0) of `stowage train --nproc {} --device {}` (width {}, {} layers, {:.1f} "
      "MiB of parameters, optimizer-state swap {}), {} thread(s) per rank, {} steps x {} rounds\n",
      r.options.train.nproc, r.options.train.device, r.options.train.width, r.options.train.layers,
      mib(r.parameter_bytes),
      r.options.train.swap_times > 0 ? fmt::format("{} batches", r.options.train.swap_times) : "off",
      r.options.train.threads, r.options.train.steps, r.options.rounds);
  text += rows_table(r).text("  ");
  const double limit = zero2_gradient_limit(r);
  const double zero2 = static_cast<double>(r.rows.back().gradient_bytes);
  text += fmt::format(
      "  goal: ZeRO-2's gradients <= 1/{} of the copies' + one of their buckets ({:.1f} MiB): {:.1f} MiB, {:.2f} of "
      "it, {}\n",
      r.options.train.nproc, limit / (1 << 20), zero2 / (1 << 20), zero2 / limit, bench::met_text(zero2 <= limit));
  return text;
}

}  // namespace stowage::cli
