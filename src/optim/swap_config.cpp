#include <stowage/error.h>
#include <stowage/optim/swap_config.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace stowage::optim {
namespace {

const std::vector<std::string>& supported_keys() {
  static const std::vector<std::string> keys = {kExpAvg, kExpAvgSq, kMaxExpAvgSq, kMasterParam};
  return keys;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

const char* io_path_name(SwapIoPath path) {
  switch (path) {
    case SwapIoPath::kAuto:
      return "auto";
    case SwapIoPath::kIoUring:
      return "io_uring";
    case SwapIoPath::kThreads:
      return "threads";
  }
  return "unknown";
}

void SwapOptimizerConfig::validate() const {
  if (swap_times_ <= 0) {
    throw InvalidArgument(fmt::format("SwapOptimizerConfig.swap_times must be positive, got {}.", swap_times_));
  }
  if (min_numel_ < 0) {
    throw InvalidArgument(fmt::format("SwapOptimizerConfig.min_numel must be non-negative, got {}.", min_numel_));
  }
  if (buffer_count_ < 2) {
    throw InvalidArgument(fmt::format(
        "SwapOptimizerConfig.buffer_count must be at least 2 (one buffer read while another is written back), got {}.",
        buffer_count_));
  }
  if (host_budget_bytes_ < 0) {
    throw InvalidArgument(
        fmt::format("SwapOptimizerConfig.host_budget_bytes must be non-negative, got {}.", host_budget_bytes_));
  }
  if (!disk_tier() && host_budget_bytes_ > 0) {
    throw InvalidArgument(fmt::format(
        "SwapOptimizerConfig.host_budget_bytes ({}) bounds the disk tier's buffers, but swap_dir is empty (host tier).",
        host_budget_bytes_));
  }
  std::vector<std::string> unknown;
  for (const std::string& key : state_keys_) {
    if (!contains(supported_keys(), key)) unknown.push_back("'" + key + "'");
  }
  if (!unknown.empty()) {
    throw InvalidArgument(
        fmt::format("SwapOptimizerConfig.state_keys only supports Adam/AdamW states ('exp_avg', 'exp_avg_sq', "
                    "'max_exp_avg_sq', 'master_param'), but got [{}].",
                    fmt::join(unknown, ", ")));
  }
  for (size_t i = 0; i < state_keys_.size(); ++i) {
    if (std::count(state_keys_.begin(), state_keys_.end(), state_keys_[i]) > 1) {
      throw InvalidArgument(fmt::format("SwapOptimizerConfig.state_keys lists '{}' more than once.", state_keys_[i]));
    }
  }
  validate_update_on_host();
  if (contains(state_keys_, kMasterParam) && !include_master_params_) {
    throw InvalidArgument(
        "SwapOptimizerConfig.state_keys lists 'master_param' but include_master_params is false; set "
        "include_master_params(true) to swap master weights.");
  }
}

void SwapOptimizerConfig::validate_update_on_host() const {
  if (!(offload_fraction_ >= 0 && offload_fraction_ <= 1)) {  // NaN fails too
    throw InvalidArgument(
        fmt::format("SwapOptimizerConfig.offload_fraction must be in [0, 1], got {}.", offload_fraction_));
  }
  if (!update_on_host_) {
    if (offload_fraction_ != 1) {
      throw InvalidArgument(
          fmt::format("SwapOptimizerConfig.offload_fraction ({}) splits the update between device and host: it needs "
                      "update_on_host(true).",
                      offload_fraction_));
    }
    return;
  }
  if (!state_keys_.empty()) {
    throw InvalidArgument(fmt::format(
        "SwapOptimizerConfig.update_on_host keeps every state on the host, but state_keys lists [{}]: leave it empty.",
        fmt::join(state_keys_, ", ")));
  }
  if (disk_tier()) {
    throw InvalidArgument(fmt::format(
        "SwapOptimizerConfig.update_on_host updates the states in host memory; the disk tier (swap_dir '{}') is not "
        "supported with it.",
        swap_dir_));
  }
}

std::vector<std::string> SwapOptimizerConfig::swapped_keys() const {
  validate();
  std::vector<std::string> keys;
  for (const std::string& key : supported_keys()) {
    const bool is_master = key == kMasterParam;
    const bool chosen = state_keys_.empty() ? !is_master || include_master_params_
                                            : contains(state_keys_, key) || (is_master && include_master_params_);
    if (chosen) keys.push_back(key);
  }
  return keys;
}

}  // namespace stowage::optim
