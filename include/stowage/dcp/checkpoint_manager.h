#pragma once

// The checkpoints of a training run in one directory (the role of Orbax's
// CheckpointManager and torchsnapshot's snapshot directory): <directory>/step-<N>, one
// dcp checkpoint each, which counts only once its metadata is committed.
//
//   dcp::CheckpointManager manager(run_dir + "/checkpoints",
//                                  dcp::CheckpointManagerOptions().save_every(50).keep_last(3), group);
//   StateDict state;
//   state.insert("model", as_ivalue(model.ptr()));    // parameters and buffers
//   state.insert("optim", as_ivalue(optimizer));      // gains its saved state on restore
//   if (const auto step = manager.restore(state)) first_step = *step + 1;
//   for (step = first_step; ...) {
//     forward, backward;
//     manager.wait_for_staging();  // the snapshot must be complete before the update
//     optimizer step;
//     manager.save(step, state);   // async, every save_every steps
//   }
//   manager.wait();  // and report what committed (poll() reports along the way)
//
// Saves are asynchronous (dcp::async_save with a DefaultStager): save() returns once
// the state is handed to the stager; the snapshot is taken while the next step's forward
// and backward run, and wait_for_staging() waits for it before the caller changes the
// state. One save is in flight at a time: a save waits for the previous one to commit.
// After each commit the older checkpoints beyond keep_last (except each keep_every-th)
// are removed, as are uncommitted directories older than it (left by a crash or a
// failed save).
//
// A checkpoint is the state of exactly the step saved: what the next forward writes
// (a module's buffers, such as BatchNorm's running statistics, and what a Stateful
// lists in entries_written_in_forward()) is copied before save() returns; the rest is
// staged in the background and must not change before wait_for_staging(). stowage
// cannot know what a Stateful of the user's does not list: if its state_dict() hands
// out, say, a BatchNorm's running_mean without listing it, call wait_for_staging()
// right after save(), before the next forward, rather than before the optimizer step.
//
// With a group every rank makes the manager, saves and restores together (the calls
// are collective, in the same order); rank 0 alone lists, removes and picks the
// checkpoint to restore, so that every rank loads the same one. One training process
// (job) per directory: on construction, uncommitted directories are removed, since no
// save of a previous process can still be in flight.
//
// Failures: a failed save (ENOSPC, EIO, EACCES, a rank's failure, a Stateful that
// throws) leaves the committed checkpoints as they were and its partial directory is
// removed. By default (SaveFailurePolicy::kContinue) it is reported, as a SaveReport
// with its error, by the poll() or wait() that finds it, and the next due save tries
// again; the max_consecutive_failures-th failure in a row is thrown instead. With
// kStop every failure is thrown, once, by the save() that starts it (what fails before
// the write, without a group) or by the next save(), poll() or wait() (the
// DistributedCheckpointError of dcp::async_save). With a group every rank sees the same outcome
// of each save (async_save's collectives), so every rank reaches the same verdict.
// restore() falls back to older committed checkpoints past ones that cannot be read,
// never for a failure of the state they are loaded into (see restore()).
//
// Preemption: on notice (dist::PreemptionNotice, agreed by every rank at a step
// boundary) the loop calls save_now(step, state), which commits the current step before
// it returns, and exits.

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/env.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/staging.h>
#include <stowage/dist/process_group.h>
#include <stowage/state/state_dict.h>

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp {

// What a failed save does (see the failures above).
enum class SaveFailurePolicy {
  kContinue,  // reported by poll()/wait(); training goes on, the next due save tries again
  kStop,      // thrown by the next save(), poll() or wait()
};

struct CheckpointManagerOptions {
  // save() saves at the steps that are multiples of this (and when forced); 0: only forced.
  TORCH_ARG(int64_t, save_every) = 0;
  // Committed checkpoints kept, the newest ones; 0: every one.
  TORCH_ARG(int64_t, keep_last) = 3;
  // Also keep, beyond keep_last, the checkpoints of steps that are multiples of this; 0: none.
  TORCH_ARG(int64_t, keep_every) = 0;
  // Every file-system call of the manager and of its writers and readers goes through
  // it (env.h); it must outlive the manager.
  TORCH_ARG(EnvPointer, env) = Env::posix();
  // Every save's options (its if_save_pending never matters: a save waits for the
  // previous one to commit first).
  TORCH_ARG(AsyncSaveOptions, save_options) = {};
  // restore() loads the next older committed checkpoint when one cannot be read
  // (corrupt, truncated, missing, unreadable: see restore()); false: it throws that
  // checkpoint's error.
  TORCH_ARG(bool, restore_falls_back) = true;
  TORCH_ARG(SaveFailurePolicy, on_save_failure) = SaveFailurePolicy::kContinue;
  // With kContinue: the failure that makes this many in a row is thrown rather than
  // reported; 0: none is.
  TORCH_ARG(int64_t, max_consecutive_failures) = 3;
};

// A save that ended: committed, or failed and removed.
struct SaveReport {
  int64_t step = 0;
  std::string path;
  bool committed = false;
  // Failed: why (its partial directory is gone, unless this says it could not be
  // removed). Committed: a removal of older checkpoints that failed, if one did, on
  // rank 0 (they stay; the next commit tries again). Empty: nothing went wrong.
  std::string error;
  int64_t bytes = 0;     // of the chunks written, by every rank; 0 if it failed
  double blocked_s = 0;  // the caller was blocked: in save() and wait_for_staging()
  double commit_s = 0;   // from save() until it committed or failed
  // The host bytes checkpointing held at their peak while this save was in flight
  // (staging buffers and the memory tier's files), as train::Trainer measures them;
  // 0 outside a Trainer.
  int64_t host_peak_bytes = 0;
};

// A committed checkpoint that restore() skipped because it could not be read.
struct SkippedCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string error;  // what loading it raised
};

// The checks of a CheckpointManager's construction that need no directory: throws
// InvalidArgument naming a negative option or a null env.
void check_checkpoint_manager_options(const CheckpointManagerOptions& options);

class CheckpointManager {
 public:
  // Makes `directory` (on rank 0) and removes the uncommitted checkpoints in it.
  // Collective with a group. Throws InvalidArgument for negative options.
  CheckpointManager(std::string directory, CheckpointManagerOptions options = {},
                    std::optional<dist::ProcessGroup> group = std::nullopt);
  // Waits for the save in flight, if any; its error, if any, is lost (call wait()).
  ~CheckpointManager();

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  const std::string& directory() const { return directory_; }
  // <directory>/step-<N>, N written with eight digits at least (step_directory_name).
  std::string checkpoint_path(int64_t step) const;
  // list_checkpoints(directory()), as this rank sees them (checkpoint_directory.h).
  std::vector<ManagedCheckpoint> list() const;
  // The newest committed checkpoint, as this rank sees it (latest_committed).
  std::optional<ManagedCheckpoint> latest() const;

  bool should_save(int64_t step) const;
  // Starts an async save of `state` as `step` if should_save(step) or `force`, and
  // returns whether it did (a save that failed at once is reported as any failed save). It waits for the save before it
  // to end first (throwing its failure as the policy says); that one's report then comes from the next poll() or
  // wait(). Throws InvalidArgument for a step at or below the last one saved (in flight
  // or committed) or restored.
  bool save(int64_t step, const StateDict& state, bool force = false);
  // Saves `step` and waits for it to end: what a preempted loop does before it exits.
  // The save in flight ends first; if it was of `step` and committed, nothing more is
  // saved. Returns the reports not yet returned, this step's last (its failure is
  // thrown instead as the policy says).
  std::vector<SaveReport> save_now(int64_t step, const StateDict& state);
  // Waits until the save in flight has its snapshot, so that the state may change.
  void wait_for_staging();
  // The saves that have ended by now and were not reported yet, oldest first (the
  // directory is pruned after each commit); a failure the policy throws is thrown
  // instead.
  std::vector<SaveReport> poll();
  // The same, after waiting for the save in flight to end.
  std::vector<SaveReport> wait();

  // Loads the newest committed checkpoint of stowage's format (rank 0's choice) into
  // `state` with dcp::load and returns its step; nothing, and `state` unchanged, if there
  // is none.
  //
  // Falling back is for a checkpoint that cannot be read, never for a failure of the
  // state it is loaded into. A checkpoint cannot be read when loading it fails on its
  // own files: a CorruptionError whose file, or an IoError (NotFound included) whose
  // path, is in the checkpoint's directory (its metadata or a data file missing,
  // unreadable, truncated or corrupt); with a group, a DistributedCheckpointError whose
  // failures are all such, so that every rank decides alike. dcp::load reads and
  // verifies every byte before the first change, so `state` is then unchanged, and with
  // restore_falls_back the next older checkpoint is tried: each skipped is added to
  // `skipped` (newest first), or warned about when `skipped` is null. If none can be
  // read, the newest's error is thrown, prefixed with what was tried.
  //
  // Any other failure is the state's, and is thrown at once, as raised (its message
  // names what failed); its checkpoint is not reported as skipped, though the newer
  // ones skipped before it are. Such are: InvalidArgument (`state` does not match the
  // checkpoint), whatever a Stateful's state_dict(), check_load_state_dict() or
  // load_state_dict() throws that is not about the checkpoint's files (e.g. an IoError
  // on a scratch file of its own), an IoError on another path or on none, an
  // out-of-memory error, and with a group an error of this rank alone (after the ranks
  // agreed, in load_state_dict()). `state` is then as dcp::load leaves it: unchanged,
  // unless a Stateful's load_state_dict() failed, which load calls after filling the
  // other entries.
  std::optional<int64_t> restore(StateDict& state, LoadOptions options = {},
                                 std::vector<SkippedCheckpoint>* skipped = nullptr);

 private:
  struct Pending;
  // Waits for the save in flight to end, prunes after a commit, and queues its report
  // (or throws its failure, as the policy says).
  void finish();
  // A failed save: removes its partial directory (rank 0), then reports or throws it.
  void handle_failure(SaveReport report, const std::exception_ptr& error, int64_t previous_saved_step);
  void prune() const;
  Env& env() const { return *options_.env(); }

  std::string directory_;
  CheckpointManagerOptions options_;
  std::optional<dist::ProcessGroup> group_;
  DefaultStager stager_;
  std::unique_ptr<Pending> pending_;
  std::vector<SaveReport> unreported_;
  int64_t last_saved_step_ = -1;
  std::vector<int64_t> failed_in_a_row_;  // the steps of the failures since the last commit
};

}  // namespace stowage::dcp
