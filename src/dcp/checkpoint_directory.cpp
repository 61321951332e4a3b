#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include "util/decimal.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace stowage::dcp {
namespace fs = std::filesystem;

namespace {

constexpr const char* kStepPrefix = "step-";

// What describe_directory takes, for its errors.
std::string directories_taken() {
  return fmt::format(
      "a checkpoint directory (holding stowage's {} or PyTorch DCP's {}), a directory of {}<N> checkpoints, or a run "
      "directory (one with a {}/ folder)",
      kMetadataFileName, kTorchDcpMetadataFileName, kStepPrefix, kRunCheckpointsFolder);
}

std::string join(const std::string& directory, const std::string& name) {
  return (fs::path(directory) / name).string();
}

// Whether `path` is a directory, or a symbolic link to one ("<path>/." names its target;
// "" + "/." would name the root).
bool is_directory(const std::string& path, Env& env) {
  return !path.empty() && env.file_type(path + "/.") == FileType::kDirectory;
}

// The last name of `path`, also when it ends with a '/'.
std::string last_name(const std::string& path) {
  const fs::path normal = fs::path(path).lexically_normal();
  return (normal.filename().empty() ? normal.parent_path().filename() : normal.filename()).string();
}

// InvalidArgument naming `path`, what it is, and what describe_directory takes.
void refuse_unless_directory(const std::string& path, Env& env) {
  if (is_directory(path, env)) return;
  const FileType type = env.file_type(path);
  const std::string problem =
      type == FileType::kAbsent ? "does not exist" : fmt::format("is not a directory but {}", describe(type));
  throw InvalidArgument(fmt::format("'{}' {}: expected {}", path, problem, directories_taken()));
}

}  // namespace

const char* format_name(CheckpointFormat format) {
  return format == CheckpointFormat::kStowage ? "stowage" : "pytorch-dcp";
}

std::optional<CheckpointFormat> committed_format(const std::string& path, Env& env) {
  if (env.file_type(join(path, kMetadataFileName)) != FileType::kAbsent) return CheckpointFormat::kStowage;
  if (env.file_type(join(path, kTorchDcpMetadataFileName)) != FileType::kAbsent) return CheckpointFormat::kPyTorchDcp;
  return std::nullopt;
}

void remove_checkpoint(const std::string& path, Env& env) {
  if (env.file_type(path) == FileType::kAbsent) return;
  uncommit_checkpoint(path, env);
  env.remove_tree(path);
}

void uncommit_checkpoint(const std::string& path, Env& env) {
  bool uncommitted = false;
  for (const char* commit : {kMetadataFileName, kTorchDcpMetadataFileName}) {
    if (env.file_type(join(path, commit)) == FileType::kAbsent) continue;
    env.remove_file(join(path, commit));
    uncommitted = true;
  }
  if (uncommitted) env.sync_directory(path);
}

std::string step_directory_name(int64_t step) {
  return fmt::format("{}{:08d}", kStepPrefix, step);
}

std::optional<int64_t> step_of_directory_name(const std::string& name) {
  const size_t prefix = std::char_traits<char>::length(kStepPrefix);
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  return parse_decimal_digits(name.substr(prefix));
}

std::vector<ManagedCheckpoint> list_checkpoints(const std::string& directory, Env& env) {
  std::vector<ManagedCheckpoint> found;
  if (env.file_type(directory) == FileType::kAbsent) return found;
  for (const std::string& name : env.list_directory(directory)) {
    const std::optional<int64_t> step = step_of_directory_name(name);
    const std::string path = join(directory, name);
    // A step directory may be a symbolic link to one.
    if (!step || !is_directory(path, env)) continue;
    const std::optional<CheckpointFormat> format = committed_format(path, env);
    found.push_back(ManagedCheckpoint{*step, path, format.has_value(), format.value_or(CheckpointFormat::kStowage)});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return found;
}

std::optional<ManagedCheckpoint> latest_committed(const std::vector<ManagedCheckpoint>& checkpoints) {
  const auto latest =
      std::find_if(checkpoints.rbegin(), checkpoints.rend(), [](const ManagedCheckpoint& c) { return c.committed; });
  if (latest == checkpoints.rend()) return std::nullopt;
  return *latest;
}

const char* describe(DirectoryKind kind) {
  return kind == DirectoryKind::kCheckpoint    ? "checkpoint"
         : kind == DirectoryKind::kCheckpoints ? "directory of checkpoints"
                                               : "run directory";
}

CheckpointDirectory describe_directory(const std::string& path, Env& env) {
  refuse_unless_directory(path, env);
  CheckpointDirectory held;
  held.path = path;
  if (const std::optional<CheckpointFormat> format = committed_format(path, env)) {
    held.format = *format;
    return held;
  }
  const std::string run_checkpoints = join(path, kRunCheckpointsFolder);
  const bool run = is_directory(run_checkpoints, env);
  held.kind = run ? DirectoryKind::kRun : DirectoryKind::kCheckpoints;
  held.checkpoints = run ? run_checkpoints : path;
  held.listed = list_checkpoints(held.checkpoints, env);
  // A folder named checkpoints with none in it yet is a run's, before its first save.
  if (run || !held.listed.empty() || last_name(path) == kRunCheckpointsFolder) return held;
  const bool uncommitted = step_of_directory_name(last_name(path)).has_value();
  throw InvalidArgument(fmt::format("'{}' holds no checkpoint: expected {}{}", path, directories_taken(),
                                    uncommitted ? "; it looks like an uncommitted checkpoint (no metadata: a save in "
                                                  "flight or the remains of a failed one)"
                                                : ""));
}

ReadableCheckpoint checkpoint_to_read(const CheckpointDirectory& directory) {
  if (directory.kind == DirectoryKind::kCheckpoint) return ReadableCheckpoint{directory.path, directory.format, {}};
  if (const std::optional<ManagedCheckpoint> latest = latest_committed(directory.listed)) {
    return ReadableCheckpoint{latest->path, latest->format, latest->step};
  }
  throw InvalidArgument(
      fmt::format("the {} '{}' has no committed checkpoint ({})", describe(directory.kind), directory.path,
                  directory.listed.empty() ? fmt::format("{} holds no step-<N> directory", directory.checkpoints)
                                           : fmt::format("{} uncommitted in {}: saves in flight or failed",
                                                         directory.listed.size(), directory.checkpoints)));
}

}  // namespace stowage::dcp
