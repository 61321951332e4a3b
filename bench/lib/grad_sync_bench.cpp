#include "grad_sync_bench.h"

#include "bench_util.h"
#include "block_mlp.h"

#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <array>
#include <optional>
#include <type_traits>
#include <vector>

namespace stowage::bench {
namespace {

enum class Mode { kCompute, kAfterBackward, kOverlap };

// One warm-up step, then one timed step, of `mode`. A reducer of its own for each
// measurement: its hooks must not see the other modes' backward passes.
double measure_step(torch::nn::Sequential& model, const at::Tensor& input, const dist::ProcessGroup& group, Mode mode,
                    const GradSyncBenchConfig& config) {
  std::optional<dist::GradientReducer> reducer;
  if (mode != Mode::kCompute) {
    reducer.emplace(model->parameters(), group,
                    dist::GradientReducerOptions().bucket_cap_mb(config.bucket_cap_mb).overlap(mode == Mode::kOverlap));
  }
  const auto step = [&] {
    if (reducer) {
      reducer->zero_grad();  // in place: the gradients are views of its buckets
    } else {
      model->zero_grad();
    }
    model->forward(input).pow(2).mean().backward();
    if (reducer) reducer->synchronize();
  };
  step();
  group.barrier();  // the ranks start the timed step together
  return seconds(step);
}

}  // namespace

double GradSyncBenchResult::hidden_fraction() const {
  return (after_backward_step_s - overlap_step_s) / (after_backward_step_s - compute_step_s);
}

GradSyncBenchResult run_grad_sync_rank(const GradSyncBenchConfig& config, const dist::ProcessGroup& group) {
  if (config.blocks < 1 || config.width < 1 || config.batch < 1 || config.steps < 1 || config.threads < 1) {
    throw InvalidArgument("grad-sync bench: blocks, width, batch, steps and threads must be positive");
  }
  torch::set_num_threads(config.threads);
  torch::manual_seed(0);
  torch::nn::Sequential model = make_block_mlp(config.blocks, config.width);
  const at::Tensor input = torch::randn({config.batch, config.width}) + static_cast<double>(group.rank());

  GradSyncBenchResult result;
  result.config = config;
  result.ranks = group.size();
  for (const at::Tensor& p : model->parameters()) result.gradient_bytes += static_cast<int64_t>(p.nbytes());
  result.buckets =
      static_cast<int64_t>(dist::GradientReducer(model->parameters(), group,
                                                 dist::GradientReducerOptions().bucket_cap_mb(config.bucket_cap_mb))
                               .buckets()
                               .size());
  std::array<std::vector<double>, 3> times;
  const std::array<Mode, 3> modes = {Mode::kCompute, Mode::kAfterBackward, Mode::kOverlap};
  for (int round = 0; round < config.steps; ++round) {
    for (size_t k = 0; k < modes.size(); ++k) {  // the order rotates, so no mode always goes first
      const size_t m = (k + static_cast<size_t>(round)) % modes.size();
      times[m].push_back(measure_step(model, input, group, modes[m], config));
    }
  }
  result.compute_step_s = median(times[0]);
  result.after_backward_step_s = median(times[1]);
  result.overlap_step_s = median(times[2]);
  return result;
}

namespace {

// The result's fields beside their JSON keys: to_json writes by this list, and
// grad_sync_result_from_json reads rank 0's result back by it.
template <typename Result, typename Field>
void grad_sync_fields(Result& r, Field&& field) {
  field("ranks", r.ranks);
  field("blocks", r.config.blocks);
  field("width", r.config.width);
  field("batch", r.config.batch);
  field("steps", r.config.steps);
  field("threads", r.config.threads);
  field("bucket_cap_mb", r.config.bucket_cap_mb);
  field("buckets", r.buckets);
  field("gradient_bytes", r.gradient_bytes);
  field("compute_step_s", r.compute_step_s);
  field("after_backward_step_s", r.after_backward_step_s);
  field("overlap_step_s", r.overlap_step_s);
}

}  // namespace

nlohmann::json to_json(const GradSyncBenchResult& r) {
  nlohmann::json out{{"benchmark", "grad_sync"},
                     {"overlap_speedup", r.after_backward_step_s / r.overlap_step_s},
                     {"hidden_fraction", r.hidden_fraction()}};
  grad_sync_fields(r, [&out](const char* key, const auto& value) { out[key] = value; });
  return out;
}

GradSyncBenchResult grad_sync_result_from_json(const nlohmann::json& json) {
  GradSyncBenchResult r;
  grad_sync_fields(
      r, [&json](const char* key, auto& value) { value = json.at(key).template get<std::decay_t<decltype(value)>>(); });
  return r;
}

std::string to_text(const GradSyncBenchResult& r) {
  return fmt::format(
      "gradient synchronisation: {} ranks, {} x Linear({}) + GELU, batch {}, {:.1f} MiB of gradients in {} "
      "bucket(s) of {} MiB, {} thread(s) per rank, median of {} steps\n"
      "  forward + backward, no communication   {:.4f} s\n"
      "  all-reduce after backward              {:.4f} s\n"
      "  all-reduce overlapped with backward    {:.4f} s  ({:.2f}x faster, {:.0f}% of the communication hidden)\n",
      r.ranks, r.config.blocks, r.config.width, r.config.batch, static_cast<double>(r.gradient_bytes) / (1 << 20),
      r.buckets, r.config.bucket_cap_mb, r.config.threads, r.config.steps, r.compute_step_s, r.after_backward_step_s,
      r.overlap_step_s, r.after_backward_step_s / r.overlap_step_s, 100 * r.hidden_fraction());
}

}  // namespace stowage::bench
