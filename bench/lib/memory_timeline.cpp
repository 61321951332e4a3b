#include "memory_timeline.h"

#include "bench_util.h"
#include "block_mlp.h"

#include <stowage/activation/sequential.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/optim/swap_optimizer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace stowage::bench {
namespace {

// Samples the accounting of `device` every `interval` from its own thread while it
// lives. Each sample is the peak since the previous one (the peak is reset after each
// read), so a short spike between two samples still shows.
class AccountingSampler {
 public:
  AccountingSampler(c10::Device device, std::chrono::microseconds interval)
      : device_(device), start_(std::chrono::steady_clock::now()) {
    memory::reset_peak_memory_stats(device_);
    samples_.push_back({0.0, memory::memory_allocated(device_)});
    thread_ = std::thread([this, interval] {
      for (;;) {
        std::this_thread::sleep_for(interval);
        const std::lock_guard<std::mutex> lock(mutex_);
        if (stopped_) return;
        take();
      }
    });
  }
  ~AccountingSampler() {
    if (thread_.joinable()) finish();
  }
  AccountingSampler(const AccountingSampler&) = delete;
  AccountingSampler& operator=(const AccountingSampler&) = delete;

  // Takes the last sample, at the step's end rather than whenever the thread wakes up
  // (late on a busy machine), stops the thread and returns them all.
  std::vector<MemorySample> finish() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      take();
      stopped_ = true;
    }
    thread_.join();
    return samples_;
  }

 private:
  void take() {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int64_t peak = memory::max_memory_allocated(device_);
    memory::reset_peak_memory_stats(device_);
    samples_.push_back({t, peak});
  }

  c10::Device device_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;  // guards samples_ and stopped_
  std::vector<MemorySample> samples_;
  bool stopped_ = false;
  std::thread thread_;
};

// One step: gradients start absent (so backward allocates them, as in every way), the
// forward runs plainly or checkpointed, then the optimizer steps and the gradients go.
void timeline_step(torch::nn::Sequential& model, const at::Tensor& input, int64_t segments,
                   const std::function<void()>& optimizer_step) {
  for (auto& parameter : model->parameters()) parameter.mutable_grad().reset();
  const at::Tensor output =
      segments == 0 ? model->forward(input) : activation::checkpoint_sequential(model, segments, input);
  output.sum().backward();
  optimizer_step();
  for (auto& parameter : model->parameters()) parameter.mutable_grad().reset();
}

MemoryTimelineRun sampled_run(const std::string& name, torch::nn::Sequential& model, const at::Tensor& input,
                              int64_t segments, const std::function<void()>& optimizer_step,
                              const MemoryTimelineOptions& options) {
  timeline_step(model, input, segments, optimizer_step);  // warm-up: creates the optimizer's state
  synchronize(options.device);
  MemoryTimelineRun run;
  run.name = name;
  AccountingSampler sampler(options.device, options.interval);
  run.step_s = seconds([&] { timeline_step(model, input, segments, optimizer_step); }, options.device);
  run.samples = sampler.finish();
  for (const MemorySample& sample : run.samples) run.peak_bytes = std::max(run.peak_bytes, sample.bytes);
  return run;
}

}  // namespace

MemoryTimeline run_memory_timeline(const MemoryTimelineOptions& options) {
  if (options.blocks < 1 || options.width < 1 || options.batch < 1 || options.swap_times < 1 || options.segments < 1 ||
      options.segments > options.blocks || options.interval.count() < 1) {
    throw InvalidArgument(fmt::format(
        "memory timeline: need positive blocks ({}), width ({}), batch ({}), swap_times ({}) and interval ({} us), "
        "and 1 <= segments ({}) <= blocks",
        options.blocks, options.width, options.batch, options.swap_times, options.interval.count(), options.segments));
  }
  memory::enable_accounting();
  torch::manual_seed(0);
  torch::nn::Sequential model = make_block_mlp(options.blocks, options.width);
  model->to(options.device);
  const at::Tensor input = torch::randn({options.batch, options.width}, torch::TensorOptions().device(options.device));
  MemoryTimeline timeline;
  timeline.options = options;
  for (const auto& parameter : model->parameters()) timeline.params_bytes += static_cast<int64_t>(parameter.nbytes());

  // Each way has its own optimizer, gone before the next way runs, so that no way's
  // curve carries another's optimizer state.
  const auto adamw = [&] {
    return std::make_shared<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
  };
  {
    auto plain = adamw();
    timeline.runs.push_back(sampled_run(
        "plain", model, input, 0, [&] { plain->step(); }, options));
    timeline.runs.push_back(sampled_run(
        "checkpointed", model, input, options.segments, [&] { plain->step(); }, options));
  }
  auto swapped = optim::swap_optimizer(adamw(), optim::SwapOptimizerConfig().swap_times(options.swap_times));
  timeline.runs.push_back(sampled_run(
      "swapped", model, input, 0, [&] { swapped->step(); }, options));
  return timeline;
}

nlohmann::json to_json(const MemoryTimeline& timeline) {
  nlohmann::json runs = nlohmann::json::array();
  for (const MemoryTimelineRun& run : timeline.runs) {
    nlohmann::json t = nlohmann::json::array();
    nlohmann::json bytes = nlohmann::json::array();
    for (const MemorySample& sample : run.samples) {
      t.push_back(sample.t_s);
      bytes.push_back(sample.bytes);
    }
    runs.push_back(
        {{"name", run.name}, {"step_s", run.step_s}, {"peak_bytes", run.peak_bytes}, {"t_s", t}, {"bytes", bytes}});
  }
  const MemoryTimelineOptions& o = timeline.options;
  return {{"device", o.device.str()},
          {"blocks", o.blocks},
          {"width", o.width},
          {"batch", o.batch},
          {"segments", o.segments},
          {"swap_times", o.swap_times},
          {"interval_s", std::chrono::duration<double>(o.interval).count()},
          {"params_bytes", timeline.params_bytes},
          {"runs", runs}};
}

}  // namespace stowage::bench
