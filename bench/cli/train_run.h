#pragma once

// `stowage train` as the benchmarks run it: the real command in a child process, given the
// arguments its own parser reads (train_arguments, cli/train_options.h), and read back
// from its run's metrics.jsonl.

#include "child_process.h"
#include "train_options.h"

#include <stowage/train/events.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace stowage::cli {

// What a fresh run's metrics.jsonl says.
struct TrainRecords {
  std::vector<train::StepRecord> steps;  // step 1 first, one per step
  // (a checkpoint's step, the step at whose end the loop saw it committed)
  std::vector<std::pair<int64_t, int64_t>> commits_seen;
  std::string activation_checkpointing;  // what the flags picked (the "setup" record's)
  std::optional<train::RunSummary> end;  // the "end" record; none: the run did not finish
};

// Reads the records of a fresh run (one that started at step 1). Throws Error naming the
// file and the line when one is no record or its steps do not follow one another.
TrainRecords read_train_records(const std::string& metrics_path);

struct TrainRun {
  ChildRun process;
  TrainRecords records;  // empty when the run left no metrics
};

// Runs `stowage train` (the program beside this one) with `options`, into a fresh
// options.run_dir that is removed afterwards, its output into `log`, with this process's
// environment plus `environment`.
TrainRun run_train(const TrainOptions& options, const std::string& log,
                   const std::map<std::string, std::string>& environment = {});

// run_train, for a run that must finish: returns its records, or throws Error "<what>
// failed (status N): <the output's end>".
TrainRecords run_train_or_throw(const TrainOptions& options, const std::string& log, const std::string& what);

}  // namespace stowage::cli
