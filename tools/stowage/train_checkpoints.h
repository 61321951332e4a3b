#pragma once

// The checkpoints of a training run: <run_dir>/checkpoints/step-<N>, one stowage::dcp
// checkpoint each. A directory counts only once its metadata is committed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage::cli {

struct RunCheckpoint {
  int64_t step = 0;
  std::string path;
  bool committed = false;
};

std::string checkpoints_dir(const std::string& run_dir);
std::string checkpoint_path(const std::string& run_dir, int64_t step);

// Every step-<N> directory of the run, oldest first.
std::vector<RunCheckpoint> list_run_checkpoints(const std::string& run_dir);

// The newest committed checkpoint, if any.
std::optional<RunCheckpoint> latest_committed(const std::string& run_dir);

// Removes committed checkpoints beyond the newest `keep`, and every uncommitted
// directory older than the newest committed one (left by a crash or a failed save;
// a newer one may be a save in flight).
void prune_checkpoints(const std::string& run_dir, int64_t keep);

// Removes every uncommitted directory: for a process starting on a run directory,
// where no save of its own can be in flight (one training process per run).
void remove_uncommitted_checkpoints(const std::string& run_dir);

}  // namespace stowage::cli
