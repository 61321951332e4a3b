#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/error.h>
#include <stowage/train/run_directory.h>

#include "util/errno_error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <vector>

namespace stowage::train {
namespace {
namespace fs = std::filesystem;

constexpr int kRunFormat = 1;

fs::path run_file(const std::string& run_dir) {
  return fs::path(run_dir) / "run.json";
}

void commit_run_file(const std::string& run_dir, const RunConfig& config) {
  const fs::path path = run_file(run_dir);
  const fs::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << nlohmann::json{{"format", kRunFormat}, {"config", config}}.dump(2) << '\n';
    out.flush();
    if (!out) util::throw_errno("cannot write " + temporary.string(), temporary.string(), "write", errno);
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error)
    util::throw_errno("cannot rename the run's configuration to " + path.string(), path.string(), "rename",
                      error.value());
}

// "--heads: 2 then, 4 now", one per setting that differs.
std::vector<std::string> differences(const RunConfig& recorded, const RunConfig& now) {
  std::vector<std::string> out;
  const auto value_in = [](const RunConfig& config, const std::string& name) {
    const auto found = config.find(name);
    return found == config.end() ? std::string("(not set)") : found->second;
  };
  RunConfig names = recorded;
  names.insert(now.begin(), now.end());
  for (const auto& [name, ignored] : names) {
    const std::string then = value_in(recorded, name), current = value_in(now, name);
    if (then != current) out.push_back(fmt::format("{}: {} then, {} now", name, then, current));
  }
  return out;
}

}  // namespace

std::string checkpoints_directory(const std::string& run_dir) {
  return (fs::path(run_dir) / dcp::kRunCheckpointsFolder).string();
}

std::optional<RunConfig> read_run_config(const std::string& run_dir) {
  const fs::path path = run_file(run_dir);
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  if (!in) util::throw_errno("cannot read " + path.string(), path.string(), "open", errno);
  const nlohmann::json record = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || record.value("format", 0) != kRunFormat || !record.contains("config") ||
      !record["config"].is_object()) {
    throw CorruptionError(fmt::format("{} is not a run configuration of format {}", path.string(), kRunFormat), "",
                          path.string());
  }
  RunConfig config;
  for (const auto& [name, value] : record["config"].items()) {
    if (!value.is_string()) {
      throw CorruptionError(fmt::format("{}: setting '{}' is not a string", path.string(), name), "", path.string());
    }
    config[name] = value.get<std::string>();
  }
  return config;
}

std::string describe_run(const std::string& run_dir) {
  std::vector<std::string> found;
  for (const char* name : {"run.json", "metrics.jsonl"}) {
    if (fs::exists(fs::path(run_dir) / name)) found.emplace_back(name);
  }
  int64_t committed = 0, latest = -1;
  for (const dcp::ManagedCheckpoint& checkpoint : dcp::list_checkpoints(checkpoints_directory(run_dir))) {
    if (!checkpoint.committed) continue;
    ++committed;
    latest = checkpoint.step;
  }
  if (committed > 0) {
    found.push_back(
        fmt::format("{} committed checkpoint{} (the latest of step {})", committed, committed == 1 ? "" : "s", latest));
  }
  if (found.empty()) return "";
  std::string text = found[0];
  for (size_t i = 1; i < found.size(); ++i) text += (i + 1 == found.size() ? " and " : ", ") + found[i];
  return text;
}

void check_run_directory(const std::string& run_dir, const RunConfig& config, bool resuming, bool allow_change) {
  if (!resuming) {
    const std::string held = describe_run(run_dir);
    if (!held.empty()) {
      throw InvalidArgument(fmt::format(
          "the run directory {} holds a run already ({}): resume it, or start this run in another directory", run_dir,
          held));
    }
    return;
  }
  const std::optional<RunConfig> recorded = read_run_config(run_dir);
  if (!recorded || allow_change) return;
  const std::vector<std::string> changed = differences(*recorded, config);
  if (changed.empty()) return;
  std::string list = changed[0];
  for (size_t i = 1; i < changed.size(); ++i) list += "; " + changed[i];
  throw InvalidArgument(fmt::format(
      "the run in {} was started with other settings than this resume has ({}): a resume keeps what shapes the "
      "model and the data (TrainerOptions::allow_config_change, stowage train's --allow-config-change, resumes "
      "anyway)",
      run_dir, list));
}

void write_run_config(const std::string& run_dir, const RunConfig& config) {
  std::error_code error;
  fs::create_directories(run_dir, error);
  if (error) util::throw_errno("cannot create the run directory " + run_dir, run_dir, "mkdir", error.value());
  commit_run_file(run_dir, config);
}

}  // namespace stowage::train
