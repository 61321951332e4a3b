#pragma once

// The activation-checkpointing benchmark: a deep MLP trained one step at a time, plain
// and under checkpoint_sequential with several segment counts, measuring step time
// and the CPU allocator's peak bytes in the same process.

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct ActivationBenchConfig {
  int64_t blocks = 32;  // Linear(width, width) + GELU each
  int64_t width = 256;
  int64_t batch = 2048;  // large against width, so that activations dominate memory
  int repetitions = 5;   // timed steps per configuration (median reported), after one warm-up
  // Segment counts to compare with the plain run; empty means {2, 4, 8, round(sqrt(blocks))}.
  std::vector<int64_t> segments;
  c10::Device device = c10::kCPU;  // where the model, its input and its activations are
};

struct ActivationRun {
  int64_t segments = 0;
  double step_s = 0;       // median forward + backward time
  int64_t peak_bytes = 0;  // most bytes live during a step
};

struct ActivationBenchResult {
  ActivationBenchConfig config;
  int64_t sqrt_segments = 0;           // round(sqrt(blocks)), the targets' configuration
  int64_t params_and_grads_bytes = 0;  // live throughout a step: weights plus their gradients
  double plain_step_s = 0;
  int64_t plain_peak_bytes = 0;
  std::vector<ActivationRun> runs;

  // Targets at sqrt_segments: activation bytes (peak minus params_and_grads) at most a
  // third of the plain run's, and step time at most 1.4x the plain run's.
  const ActivationRun& sqrt_run() const;
  double activation_ratio() const;
  double step_ratio() const;
  bool memory_target_met() const { return activation_ratio() <= 1.0 / 3.0; }
  bool time_target_met() const { return step_ratio() <= 1.4; }
};

ActivationBenchResult run_activation_bench(const ActivationBenchConfig& config);

nlohmann::json to_json(const ActivationBenchResult& result);
std::string to_text(const ActivationBenchResult& result);

}  // namespace stowage::bench
