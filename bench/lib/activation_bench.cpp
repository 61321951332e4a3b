#include "activation_bench.h"

#include "bench_util.h"

#include <stowage/activation/sequential.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace stowage::bench {
namespace {

// One block of the MLP; a module of its own, so that checkpoint_sequential splits
// the model in blocks (a Sequential cannot hold a Sequential).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width) : linear(register_module("linear", torch::nn::Linear(width, width))) {}
  at::Tensor forward(const at::Tensor& x) { return torch::gelu(linear->forward(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(Block);

torch::nn::Sequential make_mlp(const ActivationBenchConfig& config) {
  torch::nn::Sequential model;
  for (int64_t i = 0; i < config.blocks; ++i) {
    model->push_back(Block(config.width));
  }
  return model;
}

struct StepMeasurement {
  double seconds;
  int64_t peak_bytes;
};

// One forward + backward from a state without gradients, so every configuration
// starts from the same live bytes (parameters and input) and allocates its gradients
// during backward. segments == 0 is the plain run.
StepMeasurement measure_step(torch::nn::Sequential& model, const at::Tensor& input, int64_t segments) {
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad().reset();
  }
  const c10::Device device = input.device();
  memory::reset_peak_memory_stats(device);
  const double seconds = bench::seconds(
      [&] {
        const at::Tensor output =
            segments == 0 ? model->forward(input) : activation::checkpoint_sequential(model, segments, input);
        output.sum().backward();
      },
      device);
  return {seconds, memory::max_memory_allocated(device)};
}

}  // namespace

const ActivationRun& ActivationBenchResult::sqrt_run() const {
  for (const ActivationRun& run : runs) {
    if (run.segments == sqrt_segments) {
      return run;
    }
  }
  throw Error(fmt::format("activation bench: no run with {} segments", sqrt_segments));
}

double ActivationBenchResult::activation_ratio() const {
  return static_cast<double>(sqrt_run().peak_bytes - params_and_grads_bytes) /
         static_cast<double>(plain_peak_bytes - params_and_grads_bytes);
}

double ActivationBenchResult::step_ratio() const {
  return sqrt_run().step_s / plain_step_s;
}

ActivationBenchResult run_activation_bench(const ActivationBenchConfig& config) {
  if (config.blocks < 1 || config.width < 1 || config.batch < 1 || config.repetitions < 1) {
    throw InvalidArgument(
        fmt::format("activation bench: blocks, width, batch and repetitions must be positive (got {}, {}, {}, {})",
                    config.blocks, config.width, config.batch, config.repetitions));
  }
  ActivationBenchResult result;
  result.config = config;
  result.sqrt_segments = std::lround(std::sqrt(static_cast<double>(config.blocks)));
  std::vector<int64_t> segments = config.segments;
  if (segments.empty()) {
    segments = {2, 4, 8, result.sqrt_segments};
  }
  if (std::find(segments.begin(), segments.end(), result.sqrt_segments) == segments.end()) {
    segments.push_back(result.sqrt_segments);
  }
  result.config.segments = segments;

  memory::enable_accounting();
  torch::manual_seed(0);
  auto model = make_mlp(config);
  model->to(config.device);
  const at::Tensor input = torch::randn({config.batch, config.width}, torch::TensorOptions().device(config.device));
  for (const auto& parameter : model->parameters()) {
    result.params_and_grads_bytes += 2 * static_cast<int64_t>(parameter.nbytes());
  }

  // Configuration 0 is the plain run. Repetitions interleave the configurations so
  // that a slow phase of a shared machine does not land on one of them only.
  std::vector<int64_t> configurations{0};
  configurations.insert(configurations.end(), segments.begin(), segments.end());
  std::vector<std::vector<double>> seconds(configurations.size());
  std::vector<int64_t> peaks(configurations.size(), 0);
  for (int repetition = -1; repetition < config.repetitions; ++repetition) {
    for (size_t c = 0; c < configurations.size(); ++c) {
      const StepMeasurement step = measure_step(model, input, configurations[c]);
      if (repetition >= 0) {  // -1 is the warm-up
        seconds[c].push_back(step.seconds);
        peaks[c] = std::max(peaks[c], step.peak_bytes);
      }
    }
  }
  result.plain_step_s = median(seconds[0]);
  result.plain_peak_bytes = peaks[0];
  for (size_t c = 1; c < configurations.size(); ++c) {
    result.runs.push_back({configurations[c], median(seconds[c]), peaks[c]});
  }
  return result;
}

nlohmann::json to_json(const ActivationBenchResult& result) {
  nlohmann::json runs = nlohmann::json::array();
  for (const ActivationRun& run : result.runs) {
    runs.push_back({{"segments", run.segments}, {"step_s", run.step_s}, {"peak_bytes", run.peak_bytes}});
  }
  return {
      {"device", result.config.device.str()},
      {"blocks", result.config.blocks},
      {"width", result.config.width},
      {"batch", result.config.batch},
      {"repetitions", result.config.repetitions},
      {"params_and_grads", result.params_and_grads_bytes},
      {"plain_step_s", result.plain_step_s},
      {"plain_peak_bytes", result.plain_peak_bytes},
      {"runs", runs},
      {"sqrt_segments", result.sqrt_segments},
      {"activation_ratio", result.activation_ratio()},
      {"step_ratio", result.step_ratio()},
      {"memory_target_met", result.memory_target_met()},
      {"time_target_met", result.time_target_met()},
  };
}

std::string to_text(const ActivationBenchResult& result) {
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const int64_t base = result.params_and_grads_bytes;
  std::string text =
      fmt::format("MLP of {} blocks (Linear {}x{} + GELU), batch {}, median of {} steps; params+grads {:.1f} MiB\n",
                  result.config.blocks, result.config.width, result.config.width, result.config.batch,
                  result.config.repetitions, mib(base));
  text += fmt::format("{:>10} {:>10} {:>8} {:>12} {:>16} {:>10}\n", "segments", "step_s", "x plain", "peak MiB",
                      "activations MiB", "x plain");
  text += fmt::format("{:>10} {:>10.3f} {:>8.2f} {:>12.1f} {:>16.1f} {:>10.3f}\n", "plain", result.plain_step_s, 1.0,
                      mib(result.plain_peak_bytes), mib(result.plain_peak_bytes - base), 1.0);
  for (const ActivationRun& run : result.runs) {
    text +=
        fmt::format("{:>10} {:>10.3f} {:>8.2f} {:>12.1f} {:>16.1f} {:>10.3f}\n", run.segments, run.step_s,
                    run.step_s / result.plain_step_s, mib(run.peak_bytes), mib(run.peak_bytes - base),
                    static_cast<double>(run.peak_bytes - base) / static_cast<double>(result.plain_peak_bytes - base));
  }
  text += fmt::format(
      "targets at {} segments: activations {:.3f} of plain (<= 0.333: {}), step {:.2f}x plain (<= 1.4: {})\n",
      result.sqrt_segments, result.activation_ratio(), result.memory_target_met() ? "met" : "NOT met",
      result.step_ratio(), result.time_target_met() ? "met" : "NOT met");
  return text;
}

}  // namespace stowage::bench
