#include "train_checkpoints.h"

#include <stowage/dcp/metadata.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace stowage::cli {
namespace fs = std::filesystem;

std::string checkpoints_dir(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string checkpoint_path(const std::string& run_dir, int64_t step) {
  return (fs::path(checkpoints_dir(run_dir)) / fmt::format("step-{:08d}", step)).string();
}

std::vector<RunCheckpoint> list_run_checkpoints(const std::string& run_dir) {
  std::vector<RunCheckpoint> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir(run_dir), error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step-", 0) != 0) continue;
    RunCheckpoint checkpoint;
    try {
      size_t used = 0;
      checkpoint.step = std::stoll(name.substr(5), &used);
      if (used != name.size() - 5) continue;
    } catch (const std::exception&) {
      continue;
    }
    checkpoint.path = entry.path().string();
    checkpoint.committed = fs::exists(entry.path() / dcp::kMetadataFileName);
    found.push_back(checkpoint);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}

std::optional<RunCheckpoint> latest_committed(const std::string& run_dir) {
  const auto all = list_run_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->committed) return *it;
  }
  return std::nullopt;
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  const auto all = list_run_checkpoints(run_dir);
  const auto latest = latest_committed(run_dir);
  int64_t committed_seen = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const bool stale_partial = !it->committed && latest && it->step < latest->step;
    const bool beyond_keep = it->committed && ++committed_seen > keep;
    if (stale_partial || beyond_keep) fs::remove_all(it->path);
  }
}

void remove_uncommitted_checkpoints(const std::string& run_dir) {
  for (const auto& checkpoint : list_run_checkpoints(run_dir)) {
    if (!checkpoint.committed) fs::remove_all(checkpoint.path);
  }
}

}  // namespace stowage::cli
