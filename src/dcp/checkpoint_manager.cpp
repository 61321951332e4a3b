#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include "util/error_context.h"
#include "util/exception_message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <utility>

namespace stowage::dcp {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Whether `path` is `checkpoint` (a checkpoint's directory) or a file in it.
bool is_in_checkpoint(const std::string& path, const std::string& checkpoint) {
  if (path.compare(0, checkpoint.size(), checkpoint) != 0) return false;
  return path.size() == checkpoint.size() || path[checkpoint.size()] == '/';
}

// Whether a failure of one rank was on the files of `checkpoint`: corrupt, or an I/O
// error on one of them. An error of any other kind, or on another path or on none (a
// Stateful's scratch file, host memory), is a failure of the state loaded into.
bool failed_on_checkpoint_files(ErrorKind kind, const std::string& path, const std::string& file,
                                const std::string& checkpoint) {
  switch (kind) {
    case ErrorKind::kCorruption:
      return is_in_checkpoint(file, checkpoint);
    case ErrorKind::kIo:
    case ErrorKind::kNotFound:
      return is_in_checkpoint(path, checkpoint);
    default:
      return false;
  }
}

// Whether loading `checkpoint` failed because it cannot be read (restore()'s contract):
// on its own files, on every rank that failed. With a group, only a failure that every
// rank raised alike (DistributedCheckpointError) can be, so that the ranks agree.
bool cannot_be_read(const std::exception& error, const std::string& checkpoint, bool with_group) {
  if (const auto* failed = dynamic_cast<const DistributedCheckpointError*>(&error)) {
    return std::all_of(failed->failures().begin(), failed->failures().end(), [&](const auto& item) {
      const RankFailure& failure = item.second;
      return failed_on_checkpoint_files(failure.kind, failure.path, failure.file, checkpoint);
    });
  }
  if (with_group) return false;  // this rank's alone: the others have loaded
  if (const auto* corrupt = dynamic_cast<const CorruptionError*>(&error)) {
    return failed_on_checkpoint_files(corrupt->kind(), "", corrupt->file(), checkpoint);
  }
  if (const auto* io = dynamic_cast<const IoError*>(&error)) {
    return failed_on_checkpoint_files(io->kind(), io->path(), "", checkpoint);
  }
  return false;
}

// Hands restore()'s skipped checkpoints to the caller, or warns of each.
void report_skipped(std::vector<SkippedCheckpoint> unreadable, std::vector<SkippedCheckpoint>* skipped) {
  if (skipped != nullptr) {
    skipped->insert(skipped->end(), unreadable.begin(), unreadable.end());
    return;
  }
  for (const SkippedCheckpoint& checkpoint : unreadable) {
    TORCH_WARN("CheckpointManager::restore skipped ", checkpoint.path, ", which could not be read: ", checkpoint.error);
  }
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

// The save in flight. Its writer must outlive the save's response: the members are
// destroyed in reverse order, so the watcher is joined, then the response waits for the
// save, then the writer goes.
struct CheckpointManager::Pending {
  int64_t step = 0;
  int64_t previous_saved_step = -1;  // the manager's, to go back to if this save fails
  std::string path;
  Clock::time_point started;
  double blocked_s = 0;
  bool staged = false;
  std::unique_ptr<FileSystemWriter> writer;
  AsyncSaveResponse response;
  // Timestamps the commit the moment it happens.
  std::thread watcher;
  Clock::time_point committed;

  ~Pending() {
    if (watcher.joinable()) watcher.join();
  }
};

void check_checkpoint_manager_options(const CheckpointManagerOptions& options) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"save_every", options.save_every()},
                                    {"keep_last", options.keep_last()},
                                    {"keep_every", options.keep_every()}}) {
    if (value < 0) throw InvalidArgument(fmt::format("CheckpointManager: {} must be >= 0, got {}", name, value));
  }
  if (options.max_consecutive_failures() < 0) {
    throw InvalidArgument(fmt::format("CheckpointManager: max_consecutive_failures must be >= 0, got {}",
                                      options.max_consecutive_failures()));
  }
  if (options.env() == nullptr) throw InvalidArgument("CheckpointManager: the option env is null");
}

CheckpointManager::CheckpointManager(std::string directory, CheckpointManagerOptions options,
                                     std::optional<dist::ProcessGroup> group)
    : directory_(std::move(directory)), options_(std::move(options)), group_(std::move(group)) {
  check_checkpoint_manager_options(options_);
  env().create_directories(directory_);
  if (!group_ || group_->rank() == 0) {
    // One job per directory: nothing uncommitted here can be a save in flight.
    for (const ManagedCheckpoint& checkpoint : list()) {
      if (!checkpoint.committed) env().remove_tree(checkpoint.path);
    }
  }
  if (group_) group_->barrier();
}

CheckpointManager::~CheckpointManager() = default;

std::string CheckpointManager::checkpoint_path(int64_t step) const {
  return (fs::path(directory_) / step_directory_name(step)).string();
}

std::vector<ManagedCheckpoint> CheckpointManager::list() const {
  return list_checkpoints(directory_, env());
}

std::optional<ManagedCheckpoint> CheckpointManager::latest() const {
  return latest_committed(list());
}

bool CheckpointManager::should_save(int64_t step) const {
  return options_.save_every() > 0 && step % options_.save_every() == 0;
}

bool CheckpointManager::save(int64_t step, const StateDict& state, bool force) {
  if (!force && !should_save(step)) return false;
  if (step <= last_saved_step_) {
    throw InvalidArgument(
        fmt::format("CheckpointManager: cannot save step {}: step {} is saved already", step, last_saved_step_));
  }
  finish();  // one save in flight at a time
  auto pending = std::make_unique<Pending>();
  pending->step = step;
  pending->previous_saved_step = last_saved_step_;
  pending->path = checkpoint_path(step);
  pending->writer = std::make_unique<FileSystemWriter>(pending->path, FileSystemWriterOptions().env(options_.env()));
  pending->started = Clock::now();
  try {
    pending->response = async_save(state, *pending->writer, &stager_, options_.save_options(), group_);
  } catch (const std::exception& error) {
    // Without a group, async_save throws what fails before the write (a Stateful's
    // state_dict(), a tensor it cannot save); with one, that reaches every rank's
    // upload_completion instead. Either way it is a failed save.
    SaveReport report;
    report.step = step;
    report.path = pending->path;
    report.error = exception_message(error);
    report.commit_s = seconds_between(pending->started, Clock::now());
    report.blocked_s = report.commit_s;
    handle_failure(std::move(report), std::current_exception(), last_saved_step_);
    return true;
  }
  pending->blocked_s = seconds_between(pending->started, Clock::now());
  pending->watcher = std::thread([upload = pending->response.upload_completion, &committed = pending->committed] {
    upload.wait();
    committed = Clock::now();
  });
  pending_ = std::move(pending);
  last_saved_step_ = step;
  return true;
}

void CheckpointManager::wait_for_staging() {
  if (!pending_ || pending_->staged) return;
  const auto start = Clock::now();
  pending_->staged = true;
  pending_->response.staging_completion.wait();
  pending_->blocked_s += seconds_between(start, Clock::now());
}

void CheckpointManager::finish() {
  if (!pending_) return;
  wait_for_staging();
  std::unique_ptr<Pending> pending = std::move(pending_);
  pending->watcher.join();
  SaveReport report;
  report.step = pending->step;
  report.path = pending->path;
  report.blocked_s = pending->blocked_s;
  report.commit_s = seconds_between(pending->started, pending->committed);
  std::exception_ptr failure;
  try {
    const Metadata metadata = pending->response.upload_completion.get();
    for (const EntryMetadata& entry : metadata.entries) {
      for (const TensorChunk& chunk : entry.chunks) report.bytes += chunk.location.length;
    }
    report.committed = true;
  } catch (const std::exception& error) {
    report.error = exception_message(error);
    failure = std::current_exception();
  }
  const int64_t previous_saved_step = pending->previous_saved_step;
  pending.reset();  // the save's thread has ended: nothing writes into its directory any more
  if (failure) {
    handle_failure(std::move(report), failure, previous_saved_step);
    return;
  }
  failed_in_a_row_.clear();
  if (!group_ || group_->rank() == 0) {
    // Reported, never thrown, whatever the policy: the save committed, and rank 0
    // alone prunes, so a throw here would stop it without the other ranks.
    try {
      prune();
    } catch (const std::exception& error) {
      report.error = exception_message(error);
    }
  }
  unreported_.push_back(std::move(report));
}

void CheckpointManager::handle_failure(SaveReport report, const std::exception_ptr& error,
                                       int64_t previous_saved_step) {
  // A checkpoint that committed is never removed, nor saved over, whatever failed after
  // its commit (a directory's fsync). Every rank looks: they all wrote into the directory.
  const std::string metadata = (fs::path(report.path) / kMetadataFileName).string();
  bool committed = false;
  try {
    committed = env().file_type(metadata) != FileType::kAbsent;
    if (!committed && (!group_ || group_->rank() == 0) && env().file_type(report.path) != FileType::kAbsent) {
      env().remove_tree(report.path);
    }
  } catch (const std::exception& problem) {
    report.error += fmt::format("; its partial directory could not be removed: {}", exception_message(problem));
  }
  if (committed) report.error += "; its metadata was committed, so the checkpoint is kept";
  last_saved_step_ = committed ? report.step : previous_saved_step;  // else the step may be saved again
  failed_in_a_row_.push_back(report.step);
  if (options_.on_save_failure() == SaveFailurePolicy::kStop) std::rethrow_exception(error);
  const auto limit = static_cast<size_t>(options_.max_consecutive_failures());
  if (limit > 0 && failed_in_a_row_.size() >= limit) {
    const std::string steps = fmt::format("{}", fmt::join(failed_in_a_row_, ", "));
    const size_t count = std::exchange(failed_in_a_row_, {}).size();  // a caller that goes on counts anew
    throw Error(fmt::format("CheckpointManager: {} saves failed in a row (steps {}); the last one's error: {}", count,
                            steps, report.error));
  }
  unreported_.push_back(std::move(report));
}

std::vector<SaveReport> CheckpointManager::save_now(int64_t step, const StateDict& state) {
  finish();
  // Once the save in flight has ended, the last step saved is one that committed (or
  // was restored): a failed save hands its step back.
  if (last_saved_step_ != step) {
    save(step, state, /*force=*/true);
    finish();
  }
  return std::exchange(unreported_, {});
}

std::vector<SaveReport> CheckpointManager::poll() {
  if (pending_ && pending_->response.upload_completion.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    finish();
  }
  return std::exchange(unreported_, {});
}

std::vector<SaveReport> CheckpointManager::wait() {
  finish();
  return std::exchange(unreported_, {});
}

void CheckpointManager::prune() const {
  const std::vector<ManagedCheckpoint> all = list();
  const std::optional<ManagedCheckpoint> newest = latest();
  int64_t committed_seen = 0;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    // An uncommitted one newer than the newest commit is left alone: none can be in
    // flight here, but removing only older ones keeps this safe to run at any time.
    const bool stale_partial = !it->committed && newest && it->step < newest->step;
    const bool kept_for_good = options_.keep_every() > 0 && it->step % options_.keep_every() == 0;
    const bool beyond_keep = it->committed && ++committed_seen > options_.keep_last() && options_.keep_last() > 0;
    if (stale_partial || (beyond_keep && !kept_for_good)) remove_checkpoint(it->path, env());
  }
}

std::optional<int64_t> CheckpointManager::restore(StateDict& state, LoadOptions options,
                                                  std::vector<SkippedCheckpoint>* skipped) {
  // Rank 0 names each checkpoint to try, newest first, so that every rank loads the
  // same one; with a group every rank sees the same outcome of each load.
  std::vector<ManagedCheckpoint> candidates;
  if (!group_ || group_->rank() == 0) {
    // Its own format only: a PyTorch DCP checkpoint put here is kept, not restored.
    for (const ManagedCheckpoint& checkpoint : list()) {
      if (checkpoint.committed && checkpoint.format == CheckpointFormat::kStowage) {
        candidates.insert(candidates.begin(), checkpoint);
      }
    }
  }
  std::vector<SkippedCheckpoint> unreadable;
  std::exception_ptr newest_error;
  for (size_t attempt = 0;; ++attempt) {
    std::string path = attempt < candidates.size() ? candidates[attempt].path : std::string();
    if (group_) path = group_->broadcast(path, 0);
    if (path.empty()) break;
    const std::optional<int64_t> step = step_of_directory_name(fs::path(path).filename().string());
    TORCH_INTERNAL_ASSERT(step, "restored checkpoint ", path, " has no step in its name");
    try {
      FileSystemReader reader(path, options_.env());
      load(state, reader, options, group_);
    } catch (const std::exception& error) {
      if (!options_.restore_falls_back() || !cannot_be_read(error, path, group_.has_value())) {
        report_skipped(std::move(unreadable), skipped);  // the newer ones were skipped all the same
        throw;                                           // as raised: it names what failed
      }
      if (!newest_error) newest_error = std::current_exception();
      unreadable.push_back(SkippedCheckpoint{*step, path, exception_message(error)});
      continue;
    }
    report_skipped(std::move(unreadable), skipped);
    last_saved_step_ = std::max(last_saved_step_, *step);
    return step;
  }
  if (!newest_error) return std::nullopt;
  std::vector<std::string> tried;
  tried.reserve(unreadable.size());
  for (const SkippedCheckpoint& checkpoint : unreadable) tried.push_back(std::to_string(checkpoint.step));
  const std::string context = fmt::format(
      "CheckpointManager::restore: none of the committed checkpoints of {} "
      "could be read (steps {}, newest first); the newest's error: ",
      directory_, fmt::join(tried, ", "));
  report_skipped(std::move(unreadable), skipped);
  try {
    std::rethrow_exception(newest_error);
  } catch (const DistributedCheckpointError&) {
    throw;  // its failures by rank say the rest
  } catch (const Error&) {
    util::rethrow_in_context(context, "");
  }
}

}  // namespace stowage::dcp
