#pragma once

// The gradient-synchronisation benchmark of data parallelism: one rank of a group
// trains an MLP step by step, its gradients averaged over the ranks by
// dist::GradientReducer, with the all-reduces overlapped with backward and after it;
// and with no communication at all, the floor both approach. The three alternate,
// step after step, in one run.

#include <stowage/dist/process_group.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace stowage::bench {

struct GradSyncBenchConfig {
  int64_t blocks = 16;  // of make_block_mlp (block_mlp.h)
  int64_t width = 1024;
  int64_t batch = 64;
  int steps = 7;  // timed steps per mode (median reported), each after a warm-up step
  double bucket_cap_mb = 25;
  int threads = 1;  // intra-op threads per rank
};

struct GradSyncBenchResult {
  GradSyncBenchConfig config;
  int64_t ranks = 0;
  int64_t gradient_bytes = 0;
  int64_t buckets = 0;
  double compute_step_s = 0;         // forward + backward, no communication
  double after_backward_step_s = 0;  // then every bucket all-reduced
  double overlap_step_s = 0;         // buckets all-reduced during backward
  // How much of the communication time the overlap hides:
  // (after_backward - overlap) / (after_backward - compute).
  double hidden_fraction() const;
};

// Collective: every rank of `group` calls it with the same config; the figures are this
// rank's medians.
GradSyncBenchResult run_grad_sync_rank(const GradSyncBenchConfig& config, const dist::ProcessGroup& group);

nlohmann::json to_json(const GradSyncBenchResult& result);
GradSyncBenchResult grad_sync_result_from_json(const nlohmann::json& json);
std::string to_text(const GradSyncBenchResult& result);

}  // namespace stowage::bench
