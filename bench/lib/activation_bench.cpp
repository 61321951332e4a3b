#include "activation_bench.h"

#include "bench_util.h"
#include "block_mlp.h"
#include "emit.h"
#include "python_peer.h"

#include <stowage/activation/sequential.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>

#include <malloc.h>

namespace stowage::bench {
namespace {

struct StepMeasurement {
  double seconds;
  int64_t peak_bytes;
};

// Every step starts without gradients, so every configuration starts from the same
// live bytes (parameters and input) and allocates its gradients during backward.
void clear_gradients(torch::nn::Sequential& model) {
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad().reset();
  }
}

// One forward + backward; segments == 0 is the plain run.
void run_step(torch::nn::Sequential& model, const at::Tensor& input, int64_t segments) {
  const at::Tensor output =
      segments == 0 ? model->forward(input) : activation::checkpoint_sequential(model, segments, input);
  output.sum().backward();
}

StepMeasurement measure_step(torch::nn::Sequential& model, const at::Tensor& input, int64_t segments) {
  clear_gradients(model);
  const c10::Device device = input.device();
  memory::reset_peak_memory_stats(device);
  const double seconds = bench::seconds([&] { run_step(model, input, segments); }, device);
  return {seconds, memory::max_memory_allocated(device)};
}

// How compared_peak measures, as bench/peer/activation_peer.py does: PyTorch's CPU
// allocator keeps no count Python can read, so on the CPU both sides measure what the
// process holds in memory.
std::string peak_measure(c10::Device device) {
  return device.is_cpu() ? "rss_high_water_above_step_start" : "device_allocated_above_step_start";
}

// The peak memory of one step measured as peak_measure says. On the CPU, the memory
// released before it (by the allocator's cache, then by malloc's free lists) goes back to
// the system first, so that the step's own memory is what raises the high-water mark.
int64_t compared_peak(torch::nn::Sequential& model, const at::Tensor& input, int64_t segments) {
  clear_gradients(model);
  const c10::Device device = input.device();
  if (!device.is_cpu()) {
    synchronize(device);
    memory::reset_peak_memory_stats(device);
    const int64_t start = memory::memory_allocated(device);
    run_step(model, input, segments);
    synchronize(device);
    return memory::max_memory_allocated(device) - start;
  }
  memory::empty_cpu_cache();
  malloc_trim(0);
  reset_peak_rss();
  const int64_t start = status_bytes("VmRSS");
  run_step(model, input, segments);
  return status_bytes("VmHWM") - start;
}

// A request to the peer for one step of `mode` (activation_peer.py's modes).
nlohmann::json peer_step(const char* op, const char* mode, int64_t segments) {
  return {{"op", op}, {"mode", mode}, {"segments", segments}};
}

// What one side measures of one configuration: stowage's own steps, or a PyTorch variant's.
struct ActivationSeries {
  int64_t segments;
  const char* pytorch_mode;  // the peer's "mode"; nullptr: stowage's own
  std::vector<double> seconds;
  std::vector<double> compared_peaks;  // one per round of the peak pass (compared_peak)
  int64_t peak_bytes = 0;              // stowage's: the accounting's, the most of any timed step
};

bool no_more_than(double step_s, int64_t compared_peak_bytes, const PytorchFigures& pytorch) {
  return step_s <= pytorch.step_s && compared_peak_bytes <= pytorch.peak_bytes;
}

double over(double ours, double theirs) {
  return ours / theirs;
}
double over(int64_t ours, int64_t theirs) {
  return static_cast<double>(ours) / static_cast<double>(theirs);
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

bool ActivationRun::pytorch_target_met() const {
  return no_more_than(step_s, compared_peak_bytes, pytorch) &&
         no_more_than(step_s, compared_peak_bytes, pytorch_nonreentrant);
}

bool ActivationBenchResult::pytorch_target_met() const {
  return std::all_of(runs.begin(), runs.end(), [](const ActivationRun& run) { return run.pytorch_target_met(); });
}

namespace {

void check_config(const ActivationBenchConfig& config) {
  if (config.blocks < 1 || config.width < 1 || config.batch < 1 || config.repetitions < 1) {
    throw InvalidArgument(
        fmt::format("activation bench: blocks, width, batch and repetitions must be positive (got {}, {}, {}, {})",
                    config.blocks, config.width, config.batch, config.repetitions));
  }
}

// The segment counts to run, each once, in the order given: config.segments (by default
// those of 2, 4 and 8 a model this deep can have, a block each), then sqrt_segments.
std::vector<int64_t> segment_counts(const ActivationBenchConfig& config, int64_t sqrt_segments) {
  std::vector<int64_t> segments = config.segments;
  if (segments.empty()) {
    for (const int64_t count : {int64_t(2), int64_t(4), int64_t(8)}) {
      if (count <= config.blocks) segments.push_back(count);
    }
  }
  segments.push_back(sqrt_segments);
  std::vector<int64_t> counts;
  for (const int64_t count : segments) {
    if (std::find(counts.begin(), counts.end(), count) == counts.end()) counts.push_back(count);
  }
  return counts;
}

// The peer builds the same model from the same seed, on as many threads; returns its
// PyTorch version.
std::string set_up_peer(PythonPeer& peer, const ActivationBenchConfig& config, uint64_t seed, int threads) {
  const nlohmann::json setup = peer.request({{"op", "setup"},
                                             {"blocks", config.blocks},
                                             {"width", config.width},
                                             {"batch", config.batch},
                                             {"threads", threads},
                                             {"seed", seed},
                                             {"device", config.device.str()}});
  return setup.at("torch_version").get<std::string>();
}

// Stowage's plain run (0 segments) and one per segment count, each beside the peer's
// PyTorch variants of it when there is a peer.
std::vector<ActivationSeries> make_series(const std::vector<int64_t>& segments, bool with_peer) {
  std::vector<int64_t> configurations{0};
  configurations.insert(configurations.end(), segments.begin(), segments.end());
  std::vector<ActivationSeries> series;
  for (const int64_t count : configurations) {
    series.push_back({count, nullptr});
    if (!with_peer) continue;
    if (count == 0) {
      series.push_back({0, "plain"});
    } else {
      series.push_back({count, "reentrant"});
      series.push_back({count, "non_reentrant"});
    }
  }
  return series;
}

// Rounds take each series in turn, in an order that rotates from round to round
// (run_round), so that a slow phase of a shared machine does not land on some of them
// only: a warm-up round, `repetitions` timed ones, then (with a peer) as many rounds of
// peak memory, apart because giving memory back before each step costs time.
void measure_series(std::vector<ActivationSeries>& series, torch::nn::Sequential& model, const at::Tensor& input,
                    PythonPeer* peer, int repetitions) {
  bool record = false;  // false in the warm-up round
  std::vector<std::function<void()>> timed_steps;
  std::vector<std::function<void()>> peak_steps;
  for (ActivationSeries& one : series) {
    timed_steps.emplace_back([&, s = &one] {
      double step_s = 0;
      if (s->pytorch_mode == nullptr) {
        const StepMeasurement step = measure_step(model, input, s->segments);
        step_s = step.seconds;
        s->peak_bytes = std::max(s->peak_bytes, record ? step.peak_bytes : 0);
      } else {
        step_s = peer->request(peer_step("step", s->pytorch_mode, s->segments)).at("step_s").get<double>();
      }
      if (record) s->seconds.push_back(step_s);
    });
    peak_steps.emplace_back([&, s = &one] {
      const int64_t bytes =
          s->pytorch_mode == nullptr
              ? compared_peak(model, input, s->segments)
              : peer->request(peer_step("peak", s->pytorch_mode, s->segments)).at("peak_bytes").get<int64_t>();
      s->compared_peaks.push_back(static_cast<double>(bytes));
    });
  }
  run_round(0, timed_steps);
  record = true;
  for (int round = 0; round < repetitions; ++round) run_round(round, timed_steps);
  if (peer == nullptr) return;
  for (int round = 0; round < repetitions; ++round) run_round(round, peak_steps);
}

// Each series' medians into the result: stowage's plain run and runs, the peer's beside them.
void collect_series(const std::vector<ActivationSeries>& series, bool with_peer, ActivationBenchResult& result) {
  for (const int64_t count : result.config.segments) result.runs.push_back({count});
  for (const ActivationSeries& s : series) {
    const auto run = std::find_if(result.runs.begin(), result.runs.end(),
                                  [&](const ActivationRun& r) { return r.segments == s.segments; });
    const double step_s = median(s.seconds);
    const int64_t compared_peak_bytes = with_peer ? std::llround(median(s.compared_peaks)) : 0;
    const PytorchFigures pytorch{step_s, compared_peak_bytes};
    if (s.pytorch_mode == nullptr && s.segments == 0) {
      result.plain_step_s = step_s;
      result.plain_peak_bytes = s.peak_bytes;
      result.plain_compared_peak_bytes = compared_peak_bytes;
    } else if (s.pytorch_mode == nullptr) {
      run->step_s = step_s;
      run->peak_bytes = s.peak_bytes;
      run->compared_peak_bytes = compared_peak_bytes;
    } else if (s.segments == 0) {
      result.pytorch_plain = pytorch;
    } else if (std::string(s.pytorch_mode) == "reentrant") {
      run->pytorch = pytorch;
    } else {
      run->pytorch_nonreentrant = pytorch;
    }
  }
}

}  // namespace

ActivationBenchResult run_activation_bench(const ActivationBenchConfig& config) {
  check_config(config);
  ActivationBenchResult result;
  result.config = config;
  result.sqrt_segments = std::lround(std::sqrt(static_cast<double>(config.blocks)));
  result.config.segments = segment_counts(config, result.sqrt_segments);

  // Started first: the peer's Python starts while the model is built.
  std::unique_ptr<PythonPeer> peer;
  if (config.peer) peer = std::make_unique<PythonPeer>("activation_peer.py", std::vector<std::string>{});
  memory::enable_accounting();
  constexpr uint64_t kSeed = 0;
  torch::manual_seed(kSeed);
  auto model = make_block_mlp(config.blocks, config.width);
  model->to(config.device);
  const at::Tensor input = torch::randn({config.batch, config.width}, torch::TensorOptions().device(config.device));
  for (const auto& parameter : model->parameters()) {
    result.params_and_grads_bytes += 2 * static_cast<int64_t>(parameter.nbytes());
  }
  if (config.cpu_cache) {
    // Enough for every block a plain step releases: its activations, two per block.
    memory::set_cpu_cache_limit(2 * config.blocks * static_cast<int64_t>(input.nbytes()));
  }
  if (peer) {
    result.threads = at::get_num_threads();
    result.pytorch_version = set_up_peer(*peer, config, kSeed, result.threads);
    result.peak_measure = peak_measure(config.device);
  }
  std::vector<ActivationSeries> series = make_series(result.config.segments, peer != nullptr);
  measure_series(series, model, input, peer.get(), config.repetitions);
  collect_series(series, peer != nullptr, result);
  if (config.cpu_cache) memory::set_cpu_cache_limit(0);
  return result;
}

namespace {

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// A row of the first table: a configuration's step time and peak, each over the plain run's;
// `row` holds its segments cell.
Row step_and_peak(const ActivationBenchResult& result, Row row, double step_s, int64_t peak_bytes) {
  const int64_t base = result.params_and_grads_bytes;
  row.field("step_s", step_s, "{:.3f}")
      .text("x plain", fmt::format("{:.2f}", step_s / result.plain_step_s))
      .json("peak_bytes", peak_bytes)
      .text("peak MiB", fmt::format("{:.1f}", mib(peak_bytes)))
      .text("activations MiB", fmt::format("{:.1f}", mib(peak_bytes - base)))
      .text("x plain", fmt::format("{:.3f}", over(peak_bytes - base, result.plain_peak_bytes - base)));
  return row;
}

// The runs' JSON: the first table's fields, and with a peer PyTorch's figures and stowage's over them.
Table runs_table(const ActivationBenchResult& result) {
  Table table;
  for (const ActivationRun& run : result.runs) {
    Row row = step_and_peak(result, Row().field("segments", run.segments), run.step_s, run.peak_bytes);
    if (result.config.peer) {
      row.json("compared_peak_bytes", run.compared_peak_bytes)
          .json("pytorch_step_s", run.pytorch.step_s)
          .json("pytorch_peak_bytes", run.pytorch.peak_bytes)
          .json("pytorch_nonreentrant_step_s", run.pytorch_nonreentrant.step_s)
          .json("pytorch_nonreentrant_peak_bytes", run.pytorch_nonreentrant.peak_bytes)
          .json("step_over_pytorch", over(run.step_s, run.pytorch.step_s))
          .json("step_over_pytorch_nonreentrant", over(run.step_s, run.pytorch_nonreentrant.step_s))
          .json("peak_over_pytorch", over(run.compared_peak_bytes, run.pytorch.peak_bytes))
          .json("peak_over_pytorch_nonreentrant", over(run.compared_peak_bytes, run.pytorch_nonreentrant.peak_bytes))
          .json("pytorch_target_met", run.pytorch_target_met());
    }
    table.add(std::move(row));
  }
  return table;
}

// The plain run, then a row a run; the plain run's JSON is the result's plain_* keys.
Table steps_table(const ActivationBenchResult& result) {
  Table table;
  table.add(step_and_peak(result, Row().text("segments", "plain"), result.plain_step_s, result.plain_peak_bytes));
  for (const ActivationRun& run : result.runs) {
    table.add(step_and_peak(result, Row().field("segments", run.segments), run.step_s, run.peak_bytes));
  }
  return table;
}

// Against PyTorch, reentrant (pt) and not (nr); the plain run has no non-reentrant variant.
Table peer_table(const ActivationBenchResult& result) {
  const auto row = [](Row row, double step_s, int64_t peak, const PytorchFigures& pytorch,
                      const PytorchFigures* nonreentrant) {
    const double slowest_ratio =
        std::max(over(step_s, pytorch.step_s), nonreentrant ? over(step_s, nonreentrant->step_s) : 0.0);
    const double largest_ratio =
        std::max(over(peak, pytorch.peak_bytes), nonreentrant ? over(peak, nonreentrant->peak_bytes) : 0.0);
    row.text("step_s", fmt::format("{:.3f}", step_s)).text("pt step_s", fmt::format("{:.3f}", pytorch.step_s));
    if (nonreentrant) {
      row.text("pt-nr step", fmt::format("{:.3f}", nonreentrant->step_s));
    } else {
      row.missing("pt-nr step");
    }
    row.text("x pt/nr", fmt::format("{:.2f}", slowest_ratio))
        .text("peak MiB", fmt::format("{:.1f}", mib(peak)))
        .text("pt MiB", fmt::format("{:.1f}", mib(pytorch.peak_bytes)));
    if (nonreentrant) {
      row.text("pt-nr MiB", fmt::format("{:.1f}", mib(nonreentrant->peak_bytes)));
    } else {
      row.missing("pt-nr MiB");
    }
    row.text("x pt/nr", fmt::format("{:.2f}", largest_ratio));
    return row;
  };
  Table table;
  table.add(row(Row().text("segments", "plain"), result.plain_step_s, result.plain_compared_peak_bytes,
                result.pytorch_plain, nullptr));
  for (const ActivationRun& run : result.runs) {
    table.add(row(Row().field("segments", run.segments), run.step_s, run.compared_peak_bytes, run.pytorch,
                  &run.pytorch_nonreentrant));
  }
  return table;
}

}  // namespace

nlohmann::json to_json(const ActivationBenchResult& result) {
  nlohmann::json out = {
      {"device", result.config.device.str()},
      {"blocks", result.config.blocks},
      {"width", result.config.width},
      {"batch", result.config.batch},
      {"repetitions", result.config.repetitions},
      {"cpu_cache", result.config.cpu_cache},
      {"params_and_grads", result.params_and_grads_bytes},
      {"plain_step_s", result.plain_step_s},
      {"plain_peak_bytes", result.plain_peak_bytes},
      {"runs", runs_table(result).json()},
      {"sqrt_segments", result.sqrt_segments},
      {"activation_ratio", result.activation_ratio()},
      {"step_ratio", result.step_ratio()},
      {"memory_target_met", result.memory_target_met()},
      {"time_target_met", result.time_target_met()},
  };
  if (result.config.peer) {
    out["pytorch_version"] = result.pytorch_version;
    out["threads"] = result.threads;
    out["peak_measure"] = result.peak_measure;
    out["plain_compared_peak_bytes"] = result.plain_compared_peak_bytes;
    out["pytorch_plain_step_s"] = result.pytorch_plain.step_s;
    out["pytorch_plain_peak_bytes"] = result.pytorch_plain.peak_bytes;
    out["plain_step_over_pytorch"] = over(result.plain_step_s, result.pytorch_plain.step_s);
    out["plain_peak_over_pytorch"] = over(result.plain_compared_peak_bytes, result.pytorch_plain.peak_bytes);
    out["pytorch_target_met"] = result.pytorch_target_met();
  }
  return out;
}

std::string to_text(const ActivationBenchResult& result) {
  std::string text =
      fmt::format("MLP of {} blocks (Linear {}x{} + GELU), batch {}, median of {} steps; params+grads {:.1f} MiB\n",
                  result.config.blocks, result.config.width, result.config.width, result.config.batch,
                  result.config.repetitions, mib(result.params_and_grads_bytes));
  text += steps_table(result).text();
  text += fmt::format(
      "targets at {} segments: activations {:.3f} of plain (<= 0.333: {}), step {:.2f}x plain (<= 1.4: {})\n",
      result.sqrt_segments, result.activation_ratio(), met_text(result.memory_target_met()), result.step_ratio(),
      met_text(result.time_target_met()));
  if (!result.config.peer) {
    return text;
  }
  text += fmt::format(
      "against PyTorch {} (torch.utils.checkpoint.checkpoint_sequential), {} threads each; peak MiB: {}, in "
      "rounds apart from the timed steps; x pt/nr: stowage's over PyTorch's, the larger of reentrant (pt) and "
      "non-reentrant (nr)\n",
      result.pytorch_version, result.threads, result.peak_measure);
  text += peer_table(result).text();
  text += fmt::format(
      "target: checkpointing step and peak at most PyTorch's (reentrant and not) at every segment count: {}\n",
      met_text(result.pytorch_target_met()));
  return text;
}

}  // namespace stowage::bench
