#include "step_snapshot_bench.h"

#include "bench_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/staging.h>
#include <stowage/state/stateful.h>

#include <fmt/format.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>

#include <vector>

namespace stowage::bench {
namespace {

constexpr int kSnapshotRounds = 41;

}  // namespace

std::shared_ptr<torch::nn::Module> batch_norm_heavy_model() {
  torch::nn::Sequential model;
  for (int i = 0; i < 256; ++i) model->push_back(torch::nn::BatchNorm1d(1024));
  return model.ptr();
}

StepSnapshotResult run_step_snapshot_bench(const std::string& name, const std::shared_ptr<torch::nn::Module>& model,
                                           const std::string& dir) {
  StepSnapshotResult r;
  r.model = name;
  for (const at::Tensor& parameter : model->parameters()) r.state_bytes += static_cast<int64_t>(parameter.nbytes());
  for (const at::Tensor& buffer : model->buffers()) {
    r.buffer_bytes += static_cast<int64_t>(buffer.nbytes());
    ++r.buffers;
  }
  r.state_bytes += r.buffer_bytes;

  const Scratch scratch(dir, "step-snapshot");
  StateDict state;
  state.insert("model", as_ivalue(model));
  dcp::DefaultStager stager;
  int saves = 0;
  const auto blocked = [&](bool copy) {
    dcp::FileSystemWriter writer(scratch.sub(fmt::format("save-{}", saves++)));
    const auto options = dcp::AsyncSaveOptions().copy_forward_state_before_return(copy);
    dcp::AsyncSaveResponse response;
    const double s = seconds([&] { response = dcp::async_save(state, writer, &stager, options); });
    response.upload_completion.get();
    return s;
  };
  blocked(true);  // the stager's buffers, allocated once
  // The copy is a fraction of the time async_save blocks: many short rounds, taking
  // turns, so that the medians' difference rises above the noise.
  std::vector<double> with_copy;
  std::vector<double> without_copy;
  for (int round = 0; round < kSnapshotRounds; ++round) {
    run_round(round, {[&] { with_copy.push_back(blocked(true)); }, [&] { without_copy.push_back(blocked(false)); }});
  }
  r.blocked_with_copy_s = median(with_copy);
  r.blocked_without_copy_s = median(without_copy);
  return r;
}

nlohmann::json to_json(const StepSnapshotResult& r) {
  const double mib = static_cast<double>(r.buffer_bytes) / (1 << 20);
  const double cost_ms = (r.blocked_with_copy_s - r.blocked_without_copy_s) * 1e3;
  nlohmann::json out = {{"model", r.model},
                        {"state_bytes", r.state_bytes},
                        {"buffer_bytes", r.buffer_bytes},
                        {"buffers", r.buffers},
                        {"blocked_with_copy_s", r.blocked_with_copy_s},
                        {"blocked_without_copy_s", r.blocked_without_copy_s},
                        {"copy_cost_ms", cost_ms}};
  if (r.buffer_bytes > 0) {
    out["copy_cost_ms_per_mib"] = cost_ms / mib;
    out["copy_cost_met"] = cost_ms / mib <= 1.0;
  }
  return out;
}

std::string to_text(const StepSnapshotResult& r) {
  const double mib = static_cast<double>(r.buffer_bytes) / (1 << 20);
  const double cost_ms = (r.blocked_with_copy_s - r.blocked_without_copy_s) * 1e3;
  std::string line = fmt::format(
      "{}: {:.1f} MiB of state, {:.2f} MiB in {} buffers; async_save blocked {:.3f} ms with the buffer copy, {:.3f} "
      "ms without: the copy costs {:.3f} ms",
      r.model, static_cast<double>(r.state_bytes) / (1 << 20), mib, r.buffers, r.blocked_with_copy_s * 1e3,
      r.blocked_without_copy_s * 1e3, cost_ms);
  if (r.buffer_bytes > 0) {
    const double per_mib = cost_ms / mib;
    line += fmt::format(", {:.3f} ms per MiB (<= 1: {})", per_mib, per_mib <= 1.0 ? "met" : "NOT met");
  }
  return line + "\n";
}

}  // namespace stowage::bench
