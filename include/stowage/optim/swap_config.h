#pragma once

// Options of the optimizer-state swap (stowage::optim::swap_optimizer).

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::optim {

// The logical optimizer states that can be swapped.
inline constexpr const char* kExpAvg = "exp_avg";
inline constexpr const char* kExpAvgSq = "exp_avg_sq";
inline constexpr const char* kMaxExpAvgSq = "max_exp_avg_sq";
inline constexpr const char* kMasterParam = "master_param";

struct SwapOptimizerConfig {
  // Number of batches the parameters are split into; at most two batches' states are on
  // the device at any time during step().
  TORCH_ARG(int64_t, swap_times) = 16;
  // Which states to swap, a subset of exp_avg, exp_avg_sq, max_exp_avg_sq, master_param.
  // Empty: the three moments, plus master_param when include_master_params is set.
  TORCH_ARG(std::vector<std::string>, state_keys) = {};
  // States with fewer elements stay on the device: swapping them costs more than it saves.
  TORCH_ARG(int64_t, min_numel) = 1024;
  // Also swap the fp32 master weights of an optimizer that keeps them (MasterAdamW).
  TORCH_ARG(bool, include_master_params) = false;
  // Move each batch with one copy per dtype per direction, through two device staging
  // arenas, instead of one copy per state tensor.
  TORCH_ARG(bool, packed_swap) = true;

 public:
  // Throws stowage::InvalidArgument naming the offending option.
  void validate() const;
  // The states to swap, validated, in a fixed order (exp_avg, exp_avg_sq, max_exp_avg_sq,
  // master_param).
  std::vector<std::string> swapped_keys() const;
};

}  // namespace stowage::optim
