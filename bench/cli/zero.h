#pragma once

// The rows of `stowage bench grad-sync --zero`: what data parallelism holds per rank, and
// how fast it trains, with the gradients copied into the reducer's buckets (ZeRO-1 as
// stowage did before issue 25), as views of the buckets (ZeRO-1), and sharded (ZeRO-2).
// Each is the real `stowage train --nproc N` in a child process, read from its metrics.

#include "train_options.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::cli {

// `stowage train`'s model on two ranks of one thread each, plain AdamW, a few steps.
TrainOptions zero_bench_run();

struct ZeroBenchOptions {
  // What each run trains with; the modes set its ZeRO stage and gradient views. Its
  // device as `stowage train --device` takes it (sim: the simulated device); its first
  // steps are a warm-up, not timed.
  TrainOptions train = zero_bench_run();
  int rounds = 2;  // each mode once per round, the order rotating
};

// One mode's figures: rank 0's, between steps after the last step, and its peak over
// the run; tokens/s the median over the rounds of each run's median step.
struct ZeroBenchRow {
  std::string mode;  // "zero1-copies", "zero1-views", "zero2"
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  int64_t peak_step_bytes = 0;
  double tokens_per_s = 0;
};

struct ZeroBenchResult {
  ZeroBenchOptions options;
  int64_t parameter_bytes = 0;     // the model's
  std::vector<ZeroBenchRow> rows;  // in the order of the modes above
};

ZeroBenchResult run_zero_bench(const ZeroBenchOptions& options);
// The goal for ZeRO-2's gradients: the copies' over the ranks plus one of their buckets
// (25 MiB, or the whole model's gradients when smaller).
double zero2_gradient_limit(const ZeroBenchResult& result);
nlohmann::json to_json(const ZeroBenchResult& result);
std::string to_text(const ZeroBenchResult& result);

}  // namespace stowage::cli
