#pragma once

// Optimizer-state swap benchmark: the unwrapped AdamW against the swap optimizer with
// several swap_times, on one model, in one process.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct SwapBenchOptions {
  int64_t params = 100'000'000;  // fp32 parameters in all
  int64_t tensors = 50;          // split evenly into this many tensors
  int warmup_steps = 2;          // untimed steps per configuration after the first
  int steps = 7;                 // timed steps per configuration, taken in turns
  std::vector<int64_t> swap_times = {2, 4, 16};
  // The CPU allocator's block cache during the run (memory::set_cpu_cache_limit), the
  // counterpart of a device's caching allocator; 0: none, every arena is fresh memory.
  int64_t cpu_cache_bytes = int64_t(2) << 30;
};

struct SwapRun {
  int64_t swap_times = 0;
  double step_s = 0;                             // median timed step
  int64_t resident_between_steps_bytes = 0;      // optimizer state on the device between steps
  int64_t peak_resident_during_step_bytes = 0;   // most optimizer memory on the device during a step
};

struct SwapBenchResult {
  int64_t params = 0;
  double plain_step_s = 0;
  int64_t plain_state_bytes = 0;  // device-resident optimizer state of the unwrapped AdamW
  int64_t cpu_cache_bytes = 0;
  std::vector<SwapRun> runs;
};

SwapBenchResult run_swap_bench(const SwapBenchOptions& options);
nlohmann::json to_json(const SwapBenchResult& result);
// The figures with each run's ratios against the targets.
std::string to_text(const SwapBenchResult& result);

}  // namespace stowage::bench
