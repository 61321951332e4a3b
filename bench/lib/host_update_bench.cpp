#include "host_update_bench.h"

#include "bench_util.h"
#include "emit.h"
#include "python_peer.h"

#include <stowage/optim/fused_adamw.h>

#include <ATen/Parallel.h>
#include <ATen/ops/add.h>
#include <torch/optim/adamw.h>

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace stowage::bench {
namespace {

constexpr int64_t kAdamWBytesPerParam = 28;

// One fp32 parameter with a fixed gradient, and the optimizer that updates it.
template <typename Optimizer>
struct Side {
  explicit Side(int64_t params) : param(at::randn({params}).requires_grad_(true)) {
    param.mutable_grad() = at::randn({params});
    optimizer = std::make_unique<Optimizer>(std::vector<at::Tensor>{param}, torch::optim::AdamWOptions(1e-3));
    optimizer->step();  // the state is made in the first step, outside the timed ones
  }
  at::Tensor param;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<double> step_s;
};

// The streaming kernels whose best bandwidth is the floor: ATen's own, on its intra-op
// threads. Each measures the bytes it reads and writes, as an AdamW step's 28 are counted.
struct Stream {
  std::string kernel;
  int64_t bytes_per_element;
  std::function<void()> run;
  std::vector<double> seconds;
};

std::vector<Stream> streams_over(int64_t n) {
  const at::Tensor a = at::rand({n});
  const at::Tensor b = at::rand({n});
  const at::Tensor c = at::rand({n});
  return {{"copy", 8, [=] { a.copy_(b); }, {}},
          {"triad",
           12,
           [=] {
             at::Tensor out = a;
             at::add_out(out, b, c, 0.5);
           },
           {}},
          {"addcmul", 16, [=] { a.addcmul_(b, c, 1e-3); }, {}}};
}

}  // namespace

HostUpdateBenchResult run_host_update_bench(const HostUpdateBenchOptions& options) {
  at::set_num_threads(options.threads);
  at::manual_seed(0);
  Side<torch::optim::AdamW> libtorch(options.params);
  Side<optim::FusedAdamW> fused(options.params);
  std::vector<Stream> streams = streams_over(options.params);
  HostUpdateBenchResult result;
  result.options = options;
  std::unique_ptr<PythonPeer> peer;
  std::vector<double> peer_step_s;
  std::vector<std::function<void()>> turns{
      [&] { libtorch.step_s.push_back(seconds([&] { libtorch.optimizer->step(); })); },
      [&] { fused.step_s.push_back(seconds([&] { fused.optimizer->step(); })); }};
  for (auto& stream : streams) turns.emplace_back([&] { stream.seconds.push_back(seconds(stream.run)); });
  if (options.peer) {
    peer = std::make_unique<PythonPeer>("host_update_peer.py", std::vector<std::string>{});
    const auto setup = peer->request({{"op", "setup"}, {"params", options.params}, {"threads", options.threads}});
    result.peer_torch_version = setup.at("torch_version").get<std::string>();
    turns.emplace_back([&] { peer_step_s.push_back(peer->request({{"op", "step"}}).at("step_s").get<double>()); });
  }
  take_turns(turns);
  result.libtorch_adamw_s = median(libtorch.step_s);
  result.fused_adamw_s = median(fused.step_s);
  if (options.peer) result.peer_fused_adamw_s = median(peer_step_s);
  for (const auto& stream : streams) {
    result.streams.push_back({stream.kernel, gbps(stream.bytes_per_element * options.params, median(stream.seconds))});
  }
  const double best_gbps = std::max_element(result.streams.begin(), result.streams.end(), [](auto& x, auto& y) {
                             return x.gbps < y.gbps;
                           })->gbps;
  result.floor_s = static_cast<double>(kAdamWBytesPerParam * options.params) / (best_gbps * 1e9);
  return result;
}

namespace {

Table sides_table(const HostUpdateBenchResult& result) {
  Table table;
  const auto n = static_cast<double>(result.options.params);
  auto add = [&](const std::string& side, double step_s) {
    Row row;
    row.field("side", side).field("step_s", step_s, "{:.4f}").field("params_per_s", n / step_s, "{:.3g}");
    row.text("GB/s at 28 B", fmt::format("{:.1f}", gbps(kAdamWBytesPerParam * result.options.params, step_s)));
    row.text("fused faster by", fmt::format("{:.2f}x", step_s / result.fused_adamw_s));
    table.add(std::move(row));
  };
  add("libtorch_adamw", result.libtorch_adamw_s);
  add("stowage_fused_adamw", result.fused_adamw_s);
  if (result.peer_fused_adamw_s > 0) add("pytorch_fused_adamw", result.peer_fused_adamw_s);
  add("memory_floor", result.floor_s);
  return table;
}

}  // namespace

nlohmann::json to_json(const HostUpdateBenchResult& result) {
  nlohmann::json streams = nlohmann::json::object();
  for (const auto& s : result.streams) streams[s.kernel + "_gbps"] = s.gbps;
  nlohmann::json out{{"params", result.options.params},
                     {"threads", result.options.threads},
                     {"streams", streams},
                     {"sides", sides_table(result).json()},
                     {"fused_over_libtorch", result.libtorch_adamw_s / result.fused_adamw_s},
                     {"fused_over_floor", result.floor_s / result.fused_adamw_s}};
  if (result.peer_fused_adamw_s > 0) {
    out["fused_over_pytorch_fused"] = result.peer_fused_adamw_s / result.fused_adamw_s;
    out["peer_torch_version"] = result.peer_torch_version;
  }
  return out;
}

std::string to_text(const HostUpdateBenchResult& result) {
  std::string out = fmt::format("one AdamW step of {} fp32 parameters on {} threads (medians of {} rounds):\n",
                                result.options.params, result.options.threads, kRounds);
  out += sides_table(result).text("  ");
  for (const auto& s : result.streams) out += fmt::format("  stream {}: {:.1f} GB/s\n", s.kernel, s.gbps);
  const double over_floor = result.floor_s / result.fused_adamw_s;
  const double over_libtorch = result.libtorch_adamw_s / result.fused_adamw_s;
  out += fmt::format("fused / floor {:.2f} (target >= {}: {}); fused over LibTorch's AdamW {:.2f}x (>= {}: {})",
                     over_floor, kFusedOverFloorTarget, met_text(over_floor >= kFusedOverFloorTarget), over_libtorch,
                     kFusedOverLibTorchTarget, met_text(over_libtorch >= kFusedOverLibTorchTarget));
  if (result.peer_fused_adamw_s > 0) {
    const double over_peer = result.peer_fused_adamw_s / result.fused_adamw_s;
    out += fmt::format("; over PyTorch {}'s fused {:.2f}x (>= {}: {})", result.peer_torch_version, over_peer,
                       kFusedOverPeerTarget, met_text(over_peer >= kFusedOverPeerTarget));
  }
  return out + "\n";
}

}  // namespace stowage::bench
