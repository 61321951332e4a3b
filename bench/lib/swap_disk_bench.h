#pragma once

// The swap optimizer's disk tier against the disk's own limit: AdamW whose state is many
// times its host budget, stepped through scratch files, beside the raw time to write and
// read the same bytes through the same I/O path, and beside the unwrapped AdamW.

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct SwapDiskBenchOptions {
  int64_t state_bytes = int64_t(2) << 30;  // exp_avg + exp_avg_sq, 8 bytes per fp32 parameter
  int64_t tensors = 64;                    // parameter tensors, of equal size
  int64_t host_budget_bytes = int64_t(256) << 20;
  int64_t buffer_count = 4;
  std::vector<int64_t> swap_times = {16};
  std::string io_path = "auto";  // auto, io_uring or threads
  std::string dir;               // for the scratch files; empty: the temporary directory
  int warmup_steps = 1;          // untimed steps per configuration after the first
  int steps = 3;                 // timed steps per configuration, taken in turns
  c10::Device device = c10::kCPU;
};

struct SwapDiskRun {
  int64_t swap_times = 0;
  double step_s = 0;                         // median timed step
  int64_t peak_host_tier_bytes = 0;          // the tier's host buffers at their largest
  int64_t resident_between_steps_bytes = 0;  // optimizer state on the device between steps
};

struct SwapDiskBenchResult {
  std::string device;
  std::string dir;
  int64_t state_bytes = 0;
  int64_t host_budget_bytes = 0;
  std::string io_path;  // "io_uring" or "threads", as it ran
  bool direct_io = false;
  // Writing state_bytes to a scratch file and reading them back, in buffers of the tier's
  // size, through the same I/O path: what a step's swap cannot beat on this disk.
  double raw_read_write_s = 0;
  double plain_step_s = 0;  // the unwrapped AdamW, its state resident
  std::vector<SwapDiskRun> runs;
};

SwapDiskBenchResult run_swap_disk_bench(const SwapDiskBenchOptions& options);
nlohmann::json to_json(const SwapDiskBenchResult& result);
// The figures with each run's ratios against the targets.
std::string to_text(const SwapDiskBenchResult& result);

}  // namespace stowage::bench
