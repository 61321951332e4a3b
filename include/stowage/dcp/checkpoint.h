#pragma once

// save, async_save and load: the C++ counterparts of torch.distributed.checkpoint's.
//
// A top-level value of the state dict may be a Stateful (state/stateful.h): save and
// async_save call its state_dict() on the caller's thread before staging; load calls
// state_dict(), fills it, then load_state_dict(). Values in dicts may be ShardedTensors
// (sharded_tensor.h).
//
// Distributed: with a process group, every rank of the group calls the function with
// its own part of the state. Every rank plans locally; rank 0 (the coordinator) gathers
// the plans, deduplicates replicated tensors, checks that the shards tile every tensor,
// builds the metadata and scatters each rank its final plan; every rank writes its own
// data files; rank 0 gathers the results and commits the metadata only once every rank
// has written. A tensor or shard that several ranks hold is saved once, and every
// rank's copy is hashed (XXH3-64) and compared before the commit: copies that differ fail
// the save on every rank, naming the entry, rather than keep one rank's silently. A
// failure on any rank reaches every rank: each raises DistributedCheckpointError
// naming the failed ranks and their causes, and nothing is committed. Every rank takes
// part in every collective whatever failed (an error before the first one, even in
// making the FileSystemWriter or FileSystemReader of a path, is the rank's failure in
// the first step), so the group stays usable. A rank that dies or hangs fails the group
// (stowage/dist/process_group.h): the others raise DistributedCheckpointError naming it as dead or
// unresponsive, at once for a dead rank plus the group's check_in_timeout, after the
// group's timeout for a hung one; the group is then unusable.

#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/metadata.h>
#include <stowage/dist/process_group.h>
#include <stowage/dcp/sharded_tensor.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>
#include <stowage/error.h>
#include <stowage/state/state_dict.h>

#include <torch/arg.h>

#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace stowage::dcp {

// Why a distributed save or load failed on one rank: the kind of that rank's error and
// its class's fields, which travel between the ranks with it. kUnresponsive: the rank
// died or stopped answering in the collectives.
struct RankFailure {
  using Kind = ErrorKind;
  Kind kind = Kind::kError;
  std::string message;
  std::string path;       // kIo, kNotFound
  std::string operation;  // kIo, kNotFound
  int error_number = 0;   // kIo, kNotFound
  std::string entry;      // kCorruption
  std::string file;       // kCorruption
  int64_t offset = -1;    // kCorruption
};

// A distributed save or load that failed on some ranks; every rank of the group raises
// it.
class DistributedCheckpointError : public Error {
 public:
  // `step`: "start" (async_save's agreement), "plan", "write", "commit" or "load";
  // `failures`: by rank.
  DistributedCheckpointError(std::string step, std::map<int64_t, RankFailure> failures);
  const std::string& step() const { return step_; }
  const std::map<int64_t, RankFailure>& failures() const { return failures_; }

 private:
  std::string step_;
  std::map<int64_t, RankFailure> failures_;
};
// Its name until activation's error of the same name made two.
using CheckpointError [[deprecated("dcp::CheckpointError is now dcp::DistributedCheckpointError")]] =
    DistributedCheckpointError;

// Saves `state` and returns the committed metadata. On an exception nothing of this
// save remains and the previous checkpoint is untouched.
// With a group, every rank returns the committed metadata.
Metadata save(const StateDict& state, StorageWriter& writer, std::optional<dist::ProcessGroup> group = std::nullopt);
// Into `checkpoint_dir` with default FileSystemWriter options.
Metadata save(const StateDict& state, const std::string& checkpoint_dir,
              std::optional<dist::ProcessGroup> group = std::nullopt);

// What async_save does when the writer still has a save in flight, or the stager one
// that writes the stager's previous snapshot, on any writer, while the stager reuses
// its buffers (AsyncStager::reuses_buffers()).
// With a group the ranks agree first (one collective on the group, on the caller's
// thread): if any rank would reject, every rank throws DistributedCheckpointError (step "start")
// naming the ranks with a save in flight, and none starts a save.
enum class PendingSave {
  kWait,    // wait for it on the caller's thread, then stage (the default)
  kReject,  // throw Error at once
};

// The checkpoint holds the state as it was when async_save was called, provided that
// what is staged in the background does not change until staging completes
// (staging_completion): in a training loop, parameters and optimizer state, which only
// the optimizer step changes. What the next forward writes is copied before async_save
// returns instead: every entry a Stateful lists in entries_written_in_forward() (a
// module's buffers: BatchNorm's running statistics) and the entries named here.
struct AsyncSaveOptions {
  TORCH_ARG(PendingSave, if_save_pending) = PendingSave::kWait;
  // More entries to copy before returning: fully-qualified names, each also naming every
  // entry below it ("step" is "step" and "step.*").
  TORCH_ARG(std::vector<std::string>, copy_before_return) = {};
  // false: stage the Statefuls' entries_written_in_forward() in the background with the
  // rest, for a caller that changes nothing until staging completes.
  TORCH_ARG(bool, copy_forward_state_before_return) = true;
  // Host bytes staging may hold (0: no bound). A state whose tensors take more
  // (dcp::staging_footprint) is staged in waves that fit, each written before the next
  // reuses the buffers, instead of by the stager; staging_completion is then ready once
  // the last wave is staged, and the last wave is written in the background. A tensor is
  // staged whole: an entry larger than the budget fails the save (InvalidArgument naming
  // it and the smallest budget that fits). Checksums and the commit rule are unchanged.
  TORCH_ARG(int64_t, staging_budget_bytes) = 0;
};

// PyTorch returns this only when staging itself is asynchronous, and the upload future
// alone otherwise. Here there is one type: when staging is synchronous,
// staging_completion is ready on return.
//
// The response owns the save's background thread: destroying its last copy waits for
// the save to end (as the future of a std::async does). Keep a copy while the save
// runs, and keep the writer and the stager alive until then.
struct AsyncSaveResponse {
  // Ready once the snapshot is complete: from then on the source may change.
  std::shared_future<void> staging_completion;
  // Ready once the checkpoint is committed (its metadata) or the save failed (the
  // error, rethrown by get()).
  std::shared_future<Metadata> upload_completion;
  // The writer of the directory overload of async_save, freed after the thread ends.
  std::shared_ptr<StorageWriter> owned_writer;
  // The background thread, joined when the last copy of the response goes.
  std::shared_ptr<const std::thread> background;
};

// Whether an async_save on `writer` is still running.
bool has_pending_save(const StorageWriter& writer);

// Stages `state` with `stager` (else the writer, if it is an AsyncStager, else a
// blocking uncached CPU copy) and writes the snapshot on a background thread.
// Validation errors of the state dict are thrown here; errors of the write reach
// upload_completion. Stateful values are turned into state dicts on this thread. When
// the stager stages synchronously and asks for it (should_synchronize_after_execute),
// its synchronize_staging() is called after the write has started. One save per writer
// is in flight at a time (see AsyncSaveOptions); the writer must outlive the response.
//
// With a group, the background save's collectives run on a group of the same ranks of
// their own (made from `group` with new_group on the first such call, and kept with it),
// never on the group the caller's thread uses, and the background saves on it run one after another in
// the order they were started. Every rank must then return from async_save to report:
// a rank's error before the write (validation, a Stateful's state_dict(), staging)
// goes into its futures and, through the collectives, into every rank's
// upload_completion as a DistributedCheckpointError. async_save itself runs one collective on
// `group`, on the caller's thread, before anything starts (see PendingSave).
AsyncSaveResponse async_save(const StateDict& state, StorageWriter& writer, AsyncStager* stager = nullptr,
                             AsyncSaveOptions options = {}, std::optional<dist::ProcessGroup> group = std::nullopt);
// Into `checkpoint_dir` with a FileSystemWriter of default options, which the response
// owns.
AsyncSaveResponse async_save(const StateDict& state, const std::string& checkpoint_dir, AsyncStager* stager = nullptr,
                             AsyncSaveOptions options = {}, std::optional<dist::ProcessGroup> group = std::nullopt);

struct LoadOptions {
  // Leave entries the checkpoint lacks as they are, instead of failing.
  TORCH_ARG(bool, allow_partial_load) = false;
};

// Loads into `state` in place: every tensor is filled where it lies (on its device),
// every other leaf replaced. Entries the checkpoint has but `state` lacks are ignored,
// except under a Stateful's key, where they are materialised on the CPU and handed to
// its load_state_dict (a fresh optimizer gains its saved state). Everything is read
// and verified before the first change: on an exception (a missing key, a shape or
// dtype mismatch, a destination that cannot be written in place, such as an expanded
// or stride-0 view, an inference tensor or a meta tensor (the error names the entry),
// a Stateful's check_load_state_dict() rejecting what it would get, a corrupt, short or
// missing file) `state` is unchanged. What the planning pass cannot check: a Stateful
// whose load_state_dict() then fails on what its check_load_state_dict() cannot see
// (tensor contents, a lack of memory; or a Stateful that offers no check), and a data
// file rewritten in place between the verification and the fill (docs/FORMAT.md);
// those fail after the other entries were filled. A
// ShardedTensor is filled with its box of the saved tensor, whatever chunks the
// checkpoint holds; only the parts of saved chunks that overlap it are read (whole
// checksum blocks, docs/FORMAT.md).
//
// Memory: everything a load needs is read into host buffers of the size of the parts
// read and verified before the first destination changes, so a load holds up to the
// loaded bytes again in host memory at its peak; that is the price of the guarantee.
//
// With a group, every rank reads and verifies its part, then the ranks agree (every
// rank must load the same checkpoint and all must have succeeded) before any changes
// its state: on a failure anywhere every rank raises DistributedCheckpointError and no rank's
// state is changed.
void load(StateDict& state, StorageReader& reader, LoadOptions options = {},
          std::optional<dist::ProcessGroup> group = std::nullopt);
void load(StateDict& state, const std::string& checkpoint_dir, LoadOptions options = {},
          std::optional<dist::ProcessGroup> group = std::nullopt);

}  // namespace stowage::dcp
