#pragma once

// Optimizer-state swap benchmark: the unwrapped AdamW against the swap optimizer with
// several swap_times, on one model, in one process.

#include <c10/core/Device.h>
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
  // Where the parameters, gradients and updates are; the swapped states go to host memory.
  c10::Device device = c10::kCPU;
};

struct SwapRun {
  int64_t swap_times = 0;
  double step_s = 0;                            // median timed step
  int64_t resident_between_steps_bytes = 0;     // optimizer state on the device between steps
  int64_t peak_resident_during_step_bytes = 0;  // most optimizer memory on the device during a step
};

struct SwapBenchResult {
  std::string device;
  int64_t params = 0;
  double plain_step_s = 0;
  int64_t plain_state_bytes = 0;  // device-resident optimizer state of the unwrapped AdamW
  // The transfer bound of a swapped step: moving plain_state_bytes up and as many down at
  // once on the copy engine's two lanes, nothing else running (pinned host memory where
  // the build can pin). A step cannot beat max(plain_step_s, copy_bound_s).
  double copy_bound_s = 0;
  int64_t cpu_cache_bytes = 0;
  std::vector<SwapRun> runs;
};

SwapBenchResult run_swap_bench(const SwapBenchOptions& options);
nlohmann::json to_json(const SwapBenchResult& result);
// The figures with each run's ratios against the targets.
std::string to_text(const SwapBenchResult& result);

}  // namespace stowage::bench
