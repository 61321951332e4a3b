#include "swap_bench.h"

#include "bench_util.h"
#include "emit.h"

#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/copy_engine.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/optim/swap_optimizer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

namespace stowage::bench {
namespace {

// Targets of issue 6: peak <= (2 / swap_times + 0.05) x plain state; step <= 1.5 x plain.
double peak_limit(const SwapBenchResult& r, int64_t swap_times) {
  return (2.0 / static_cast<double>(swap_times) + 0.05) * static_cast<double>(r.plain_state_bytes);
}
constexpr double kStepLimit = 1.5;

// SwapBenchResult::copy_bound_s: `bytes` each way, in chunks of a pinned buffer reused.
double copy_bound_seconds(c10::Device device, int64_t bytes) {
  constexpr int64_t kChunk = int64_t(64) << 20;
  const memory::HostAllocOptions pinned{/*pin_memory=*/true, /*share_memory=*/false};
  const at::Tensor host_up = memory::allocate_host({kChunk}, at::kByte, pinned).fill_(1);
  const at::Tensor host_down = memory::allocate_host({kChunk}, at::kByte, pinned);
  const at::Tensor device_up = at::empty({kChunk}, at::TensorOptions().dtype(at::kByte).device(device));
  const at::Tensor device_down = at::zeros({kChunk}, at::TensorOptions().dtype(at::kByte).device(device));
  memory::CopyEngine engine(device);
  const auto move = [&](int64_t total) {
    for (int64_t done = 0; done < total; done += kChunk) {
      engine.copy(memory::CopyLane::kHostToDevice, device_up, host_up);
      engine.copy(memory::CopyLane::kDeviceToHost, host_down, device_down);
    }
    engine.synchronize(engine.record(memory::CopyLane::kHostToDevice));
    engine.synchronize(engine.record(memory::CopyLane::kDeviceToHost));
  };
  move(kChunk);  // first touch of the buffers, lanes started
  return seconds([&] { move(bytes); }, device);
}

// A swap optimizer's steps, each timed one measuring the device memory it takes into `run`.
RoundRobinStep measured_step(optim::SwapOptimizer& swap, SwapRun& run, c10::Device device) {
  const auto step = [&swap] { swap.step(); };
  return {step, [step, &run, device] {
            // What is allocated now holds this optimizer's resident state and everything else.
            const int64_t before = memory::memory_allocated(device);
            memory::reset_peak_memory_stats(device);
            const double step_seconds = seconds(step, device);
            run.peak_resident_during_step_bytes =
                std::max(run.peak_resident_during_step_bytes,
                         memory::max_memory_allocated(device) - before + run.resident_between_steps_bytes);
            run.resident_between_steps_bytes += memory::memory_allocated(device) - before;
            return step_seconds;
          }};
}

}  // namespace

SwapBenchResult run_swap_bench(const SwapBenchOptions& options) {
  if (options.params <= 0 || options.tensors <= 0 || options.tensors > options.params || options.steps <= 0 ||
      options.warmup_steps < 0) {
    throw InvalidArgument(
        fmt::format("bench swap: need 0 < tensors ({}) <= params ({}), steps ({}) > 0 and warmup_steps ({}) >= 0",
                    options.tensors, options.params, options.steps, options.warmup_steps));
  }
  if (options.cpu_cache_bytes < 0) {
    throw InvalidArgument(fmt::format("bench swap: cpu_cache_bytes must be >= 0, got {}", options.cpu_cache_bytes));
  }
  memory::set_cpu_cache_limit(options.cpu_cache_bytes);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const c10::Device device = options.device;
  const auto on_device = torch::TensorOptions().device(device);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < options.tensors; ++i) {
    const int64_t numel = options.params / options.tensors + (i < options.params % options.tensors ? 1 : 0);
    auto p = torch::rand({numel}, on_device).sub_(0.5).requires_grad_();
    p.mutable_grad() = torch::rand({numel}, on_device).sub_(0.5);
    params.push_back(p);
  }
  SwapBenchResult result;
  result.device = device.str();
  result.params = options.params;
  result.cpu_cache_bytes = options.cpu_cache_bytes;
  const auto adamw = [&] { return std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3)); };

  // Every optimizer lives for the whole run, and the timed steps go round-robin (plain,
  // then each swap_times, again and again), so that every configuration meets the same
  // machine state: the same other load, the same malloc heap (glibc serves the plain
  // step's parameter-sized temporaries from the heap only once it has freed one such
  // mmap'd block, which the warm-up steps do).
  auto plain = adamw();
  {
    const int64_t before = memory::memory_allocated(device);
    plain->step();  // creates the states
    result.plain_state_bytes = memory::memory_allocated(device) - before;
  }
  std::vector<c10::intrusive_ptr<optim::SwapOptimizer>> swaps;
  for (const int64_t swap_times : options.swap_times) {
    const int64_t before = memory::memory_allocated(device);
    swaps.push_back(optim::swap_optimizer(adamw(), optim::SwapOptimizerConfig().swap_times(swap_times)));
    swaps.back()->step();  // creates the states in host buffers
    SwapRun run;
    run.swap_times = swap_times;
    run.resident_between_steps_bytes = memory::memory_allocated(device) - before;
    result.runs.push_back(run);
  }
  std::vector<RoundRobinStep> configurations = {clocked_step([&] { plain->step(); }, device)};
  for (size_t i = 0; i < swaps.size(); ++i) configurations.push_back(measured_step(*swaps[i], result.runs[i], device));
  const std::vector<double> medians = median_seconds_in_rounds(configurations, options.warmup_steps, options.steps);
  result.plain_step_s = medians[0];
  result.copy_bound_s = copy_bound_seconds(device, result.plain_state_bytes);
  for (size_t i = 0; i < swaps.size(); ++i) result.runs[i].step_s = medians[i + 1];
  plain.reset();
  swaps.clear();
  memory::set_cpu_cache_limit(0);
  return result;
}

namespace {

// A row a run: its figures, and in the text its ratios against the targets.
Table runs_table(const SwapBenchResult& result) {
  Table table;
  for (const SwapRun& run : result.runs) {
    const double step_ratio = run.step_s / result.plain_step_s;
    const double peak_ratio = run.peak_resident_during_step_bytes / peak_limit(result, run.swap_times);
    table.add(Row()
                  .field("swap_times", run.swap_times)
                  .field("step_s", run.step_s, "{:.3f}")
                  .text("step/plain", fmt::format("{:.2f} ({})", step_ratio, met_text(step_ratio <= kStepLimit)))
                  .field("resident_between_steps_bytes", run.resident_between_steps_bytes, "{}", "between (B)")
                  .json("peak_resident_during_step_bytes", run.peak_resident_during_step_bytes)
                  .text("peak (MiB)", fmt::format("{:.1f}", run.peak_resident_during_step_bytes / 1048576.0))
                  .text("peak/limit", fmt::format("{:.2f} ({})", peak_ratio, met_text(peak_ratio <= 1))));
  }
  return table;
}

}  // namespace

nlohmann::json to_json(const SwapBenchResult& result) {
  return {{"params", result.params},
          {"plain_step_s", result.plain_step_s},
          {"plain_state_bytes", result.plain_state_bytes},
          {"copy_bound_s", result.copy_bound_s},
          {"cpu_cache_bytes", result.cpu_cache_bytes},
          {"device", result.device},
          {"runs", runs_table(result).json()}};
}

std::string to_text(const SwapBenchResult& result) {
  std::string out = fmt::format(
      "AdamW on {} fp32 parameters on {}: plain step {:.3f} s, device-resident state {:.1f} MiB (CPU block cache {} "
      "MiB); moving that state up and down at once takes {:.3f} s\n",
      result.params, result.device, result.plain_step_s, result.plain_state_bytes / 1048576.0,
      result.cpu_cache_bytes >> 20, result.copy_bound_s);
  out += runs_table(result).text();
  out += fmt::format(
      "targets: step/plain <= {}, peak <= (2/swap_times + 0.05) x plain state, between = 0 (all "
      "states swappable)\n",
      kStepLimit);
  return out;
}

}  // namespace stowage::bench
