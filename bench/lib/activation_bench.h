#pragma once

// The activation-checkpointing benchmark: a deep MLP trained one step at a time, plain
// and under checkpoint_sequential with several segment counts, measuring step time
// and the CPU allocator's peak bytes in the same process. With a peer, the same model in
// PyTorch (bench/peer/activation_peer.py: torch.utils.checkpoint.checkpoint_sequential,
// reentrant and not) takes turns with it.

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct ActivationBenchConfig {
  int64_t blocks = 32;  // of make_block_mlp (block_mlp.h)
  int64_t width = 256;
  int64_t batch = 2048;  // large against width, so that activations dominate memory
  int repetitions = 5;   // timed steps per configuration (median reported), after one warm-up;
                         // with a peer, as many peak measurements too
  // Segment counts to compare with the plain run; empty means those of {2, 4, 8} up to
  // blocks. round(sqrt(blocks)) is always added.
  std::vector<int64_t> segments;
  c10::Device device = c10::kCPU;  // where the model, its input and its activations are
  // Let the CPU allocator keep the blocks a step releases for the next step
  // (memory::set_cpu_cache_limit), so that steps do not page-fault fresh memory in.
  bool cpu_cache = true;
  // Also measure PyTorch on the same model (python_peer.h; needs the torch wheel's Python).
  bool peer = false;
};

// The figures of one configuration in PyTorch, from the peer.
struct PytorchFigures {
  double step_s = 0;       // median forward + backward time
  int64_t peak_bytes = 0;  // measured as ActivationRun::compared_peak_bytes
};

struct ActivationRun {
  int64_t segments = 0;
  double step_s = 0;       // median forward + backward time
  int64_t peak_bytes = 0;  // most bytes live during a step (the accounting's)
  // With a peer: the peak measured as PyTorch's is (ActivationBenchResult::peak_measure),
  // in rounds apart from the timed steps, and PyTorch's checkpoint_sequential reentrant and not.
  int64_t compared_peak_bytes = 0;
  PytorchFigures pytorch;
  PytorchFigures pytorch_nonreentrant;
  // step time and compared peak at most each PyTorch variant's
  bool pytorch_target_met() const;
};

struct ActivationBenchResult {
  ActivationBenchConfig config;
  int64_t sqrt_segments = 0;           // round(sqrt(blocks)), the targets' configuration
  int64_t params_and_grads_bytes = 0;  // live throughout a step: weights plus their gradients
  double plain_step_s = 0;
  int64_t plain_peak_bytes = 0;
  std::vector<ActivationRun> runs;

  // With a peer (config.peer).
  std::string pytorch_version;
  int threads = 0;           // intra-op threads of both sides (at::get_num_threads)
  std::string peak_measure;  // how compared peaks are measured, the same on both sides
  int64_t plain_compared_peak_bytes = 0;
  PytorchFigures pytorch_plain;
  // Every run's pytorch_target_met: checkpointing no slower than PyTorch's at any segment count, at
  // equal or lower peak memory.
  bool pytorch_target_met() const;

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
