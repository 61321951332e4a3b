#pragma once

// What a checkpoint that holds exactly one step costs at save(): the copy of what the
// next forward writes (module buffers), taken before dcp::async_save returns
// (AsyncSaveOptions::copy_forward_state_before_return), against the same save without
// it.

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace stowage::bench {

struct StepSnapshotResult {
  std::string model;
  int64_t state_bytes = 0;   // the model's parameters and buffers
  int64_t buffer_bytes = 0;  // its buffers: what is copied before async_save returns
  int64_t buffers = 0;
  double blocked_with_copy_s = 0;     // caller blocked by async_save with a DefaultStager (median)
  double blocked_without_copy_s = 0;  // the same with the copy switched off
};

// A model of 256 BatchNorm1d(1024) layers: 2 MiB of buffers in 768 tensors.
std::shared_ptr<torch::nn::Module> batch_norm_heavy_model();

// Saves `model` (as dcp::ModuleState) with and without the copy, taking turns over 41
// rounds (run_round), each save written to `dir` (empty: the temporary directory) and
// waited for before the next.
StepSnapshotResult run_step_snapshot_bench(const std::string& name, const std::shared_ptr<torch::nn::Module>& model,
                                           const std::string& dir = "");

nlohmann::json to_json(const StepSnapshotResult& result);
// One line, with the target (the copy costs at most 1 ms per MiB of buffers).
std::string to_text(const StepSnapshotResult& result);

}  // namespace stowage::bench
