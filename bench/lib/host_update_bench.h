#pragma once

// The optimizer update on the host, alone (issue 41): one AdamW step of one fp32 tensor,
// in parameters a second, by LibTorch's torch::optim::AdamW (op by op), stowage's
// FusedAdamW, and (with the peer) PyTorch's fused CPU AdamW (torch.optim.AdamW(fused=True),
// bench/peer/host_update_peer.py), on the same number of intra-op threads, beside the
// memory's floor: an AdamW step moves 28 bytes a parameter (reads p, g, m, v; writes p, m,
// v), and the best bandwidth of a few streaming kernels measured in the same run (ATen's
// copy, triad a = b + s * c and addcmul_, on the same threads) says how fast that can go on
// this machine.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct HostUpdateBenchOptions {
  int64_t params = 16 << 20;  // elements of the one fp32 parameter (the 16 M)
  int threads = 2;            // intra-op threads of every side
  bool peer = false;          // PyTorch's fused CPU AdamW too (the wheel's Python)
};

// A streaming kernel's bandwidth: bytes it moved over its median time.
struct StreamFigure {
  std::string kernel;
  double gbps = 0;
};

struct HostUpdateBenchResult {
  HostUpdateBenchOptions options;
  double libtorch_adamw_s = 0;  // medians of the rounds (bench_util.h's take_turns)
  double fused_adamw_s = 0;
  double peer_fused_adamw_s = 0;  // 0: not measured
  std::string peer_torch_version;
  std::vector<StreamFigure> streams;
  double floor_s = 0;  // 28 bytes a parameter at the best stream's bandwidth
};

// The targets: fused >= 1.0x PyTorch's fused, >= 0.8x the floor, >= 4x LibTorch's.
inline constexpr double kFusedOverPeerTarget = 1.0;
inline constexpr double kFusedOverFloorTarget = 0.8;
inline constexpr double kFusedOverLibTorchTarget = 4.0;

HostUpdateBenchResult run_host_update_bench(const HostUpdateBenchOptions& options);
nlohmann::json to_json(const HostUpdateBenchResult& result);
std::string to_text(const HostUpdateBenchResult& result);

}  // namespace stowage::bench
