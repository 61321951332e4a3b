#pragma once

// Memory over time of one training step (forward, backward, optimizer step) of a deep
// MLP, three ways: plain AdamW, with the blocks under activation::checkpoint_sequential,
// and with AdamW's state swapped to host memory (optim::swap_optimizer). A background
// thread samples the byte accounting (memory/accounting.h) while each step runs, so the
// report (report.h) can draw the three curves on one time axis.

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct MemoryTimelineOptions {
  int64_t blocks = 16;  // of make_block_mlp (block_mlp.h)
  int64_t width = 256;
  int64_t batch = 1024;
  int64_t segments = 4;    // checkpoint_sequential's segments in the checkpointed step
  int64_t swap_times = 4;  // swap_optimizer's batches in the swapped step
  std::chrono::microseconds interval{500};
  c10::Device device = c10::kCPU;
};

struct MemorySample {
  double t_s = 0;     // since the step began
  int64_t bytes = 0;  // the most bytes allocated since the previous sample
};

struct MemoryTimelineRun {
  std::string name;  // "plain", "checkpointed", "swapped"
  double step_s = 0;
  int64_t peak_bytes = 0;
  std::vector<MemorySample> samples;
};

struct MemoryTimeline {
  MemoryTimelineOptions options;
  int64_t params_bytes = 0;
  std::vector<MemoryTimelineRun> runs;
};

// One warm-up step (which creates the optimizer's state) and one sampled step for each
// way, on the same model and input. Throws InvalidArgument for non-positive sizes or
// segments > blocks.
MemoryTimeline run_memory_timeline(const MemoryTimelineOptions& options);

nlohmann::json to_json(const MemoryTimeline& timeline);

}  // namespace stowage::bench
