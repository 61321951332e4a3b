#include "train_checks.h"

#include "cli_numbers.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace stowage::cli {
namespace fs = std::filesystem;

std::string swap_dir(const TrainOptions& options) {
  const std::string prefix = "disk:";
  if (options.swap_to == "host") return "";
  if (options.swap_to.rfind(prefix, 0) == 0 && options.swap_to.size() > prefix.size()) {
    return options.swap_to.substr(prefix.size());
  }
  throw InvalidArgument(fmt::format("--swap-to '{}': expected 'host' or 'disk:DIR'", options.swap_to));
}

optim::SwapOptimizerConfig swap_config(const TrainOptions& options) {
  // The host update is a mode of the swap; with --swap-times 0 the whole update is on the
  // host (check_train_options), and the swap's one batch is never used.
  auto config = optim::SwapOptimizerConfig()
                    .swap_times(std::max<int64_t>(1, options.swap_times))
                    .swap_dir(swap_dir(options))
                    .update_on_host(options.optimizer_update == "host")
                    .offload_fraction(options.offload_fraction);
  if (!options.swap_host_budget.empty()) config.host_budget_bytes(*parse_byte_size(options.swap_host_budget));
  return config;
}

void check_train_options(const TrainOptions& options, int64_t world_size) {
  const auto refuse = [](const std::string& text) { throw InvalidArgument(text); };
  if (options.batch % world_size != 0) {
    refuse(fmt::format("--batch {} (the global batch) does not split evenly over {} ranks", options.batch, world_size));
  }
  if (options.recompute_segments > options.layers) {
    refuse(fmt::format("--recompute-segments {} exceeds the {} transformer blocks", options.recompute_segments,
                       options.layers));
  }
  const bool recompute = options.recompute_segments > 0 || !options.selective_recompute.empty();
  if (options.offload_checkpoint_inputs && !recompute) {
    refuse(
        "--offload-checkpoint-inputs offloads the inputs of activation checkpoints, but none are made: pass "
        "--recompute-segments N or --selective-recompute with it");
  }
  if (!options.activation_budget.empty() && (recompute || options.offload_checkpoint_inputs)) {
    refuse(
        fmt::format("--activation-budget {} picks what to recompute and offload itself: pass no "
                    "--recompute-segments, --selective-recompute or --offload-checkpoint-inputs with it",
                    options.activation_budget));
  }
  if (!options.selective_recompute.empty() && options.recompute_segments > 0) {
    refuse(
        fmt::format("--selective-recompute {} checkpoints part of each block and --recompute-segments {} whole "
                    "blocks: pass --recompute-segments 0 with --selective-recompute",
                    options.selective_recompute, options.recompute_segments));
  }
  const std::string dir = swap_dir(options);
  if (!dir.empty() && options.swap_times == 0) refuse("--swap-to " + options.swap_to + " needs --swap-times N > 0");
  if (!dir.empty() && (!fs::is_directory(dir) || access(dir.c_str(), W_OK | X_OK) != 0)) {
    refuse(fmt::format("--swap-to {}: '{}' is not a directory this process can write to", options.swap_to, dir));
  }
  if (options.optimizer_update == "host" && options.offload_fraction < 1 && options.swap_times == 0) {
    refuse(
        fmt::format("--offload-fraction {} leaves part of the update on the device, which goes through the "
                    "swap: pass --swap-times N > 0 with it",
                    options.offload_fraction));
  }
  // The swap's own refusals (a host budget without the disk tier, a fraction without the
  // host update, the host update with the disk tier), as the library words them.
  swap_config(options).validate();
  if (!fs::exists(options.corpus)) refuse(fmt::format("--corpus {}: no such file or directory", options.corpus));
  if (!options.resume_from.empty() && !fs::exists(options.resume_from)) {
    refuse(fmt::format("--resume-from {}: no such checkpoint", options.resume_from));
  }
}

}  // namespace stowage::cli
