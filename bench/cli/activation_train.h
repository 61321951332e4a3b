#pragma once

// `stowage bench activation --train-model`: activation memory and step time of `stowage
// train`'s transformer under each way of checkpointing it (none, whole blocks at √n
// segments and at one block a segment, with and without their inputs offloaded, the
// attention core or the MLP alone, and the plan --activation-budget picks at three
// budgets), at two sequence lengths. Each is the real `stowage train` in a child process,
// read from its metrics: on the CPU for time, on the simulated device (sim) for device
// memory.

#include "train_options.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::cli {

struct ActivationTrainBenchOptions {
  // What each run trains with; the modes set its checkpointing and sequence length.
  TrainOptions train = default_run();
  std::vector<int64_t> seq_lens = {64, 256};
  // The budgets: shares of the way from the least peak of the fixed modes to none's.
  std::vector<double> budget_shares = {0.25, 0.5, 0.75};
  int rounds = 2;  // each mode once per round, the order rotating

  static TrainOptions default_run();
};

struct ActivationTrainBenchRow {
  int64_t seq_len = 0;
  std::string mode;                   // "none", "whole, 3 segments (sqrt n)", "mlp", "budget 50% (12.4 MiB)", ...
  int64_t budget_bytes = 0;           // budget rows only
  int64_t peak_activation_bytes = 0;  // the most any step took
  double step_s = 0;                  // median over the rounds of each run's median step
  std::string plan;                   // budget rows: what the planner picked
};

struct ActivationTrainBenchResult {
  ActivationTrainBenchOptions options;
  std::vector<ActivationTrainBenchRow> rows;  // by sequence length, "none" first
};

ActivationTrainBenchResult run_activation_train_bench(const ActivationTrainBenchOptions& options);
nlohmann::json to_json(const ActivationTrainBenchResult& result);
std::string to_text(const ActivationTrainBenchResult& result);

}  // namespace stowage::cli
