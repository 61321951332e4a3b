#pragma once

// save, async_save and load: the C++ counterparts of torch.distributed.checkpoint's.
//
// A top-level value of the state dict may be a Stateful (state/stateful.h): save and
// async_save call its state_dict() on the caller's thread before staging; load calls
// state_dict(), fills it, then load_state_dict().

#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/metadata.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>
#include <stowage/state/state_dict.h>

#include <torch/arg.h>

#include <future>
#include <string>

namespace stowage::dcp {

// Saves `state` and returns the committed metadata. On an exception nothing of this
// save remains and the previous checkpoint is untouched.
Metadata save(const StateDict& state, StorageWriter& writer);
// Into `checkpoint_dir` with default FileSystemWriter options.
Metadata save(const StateDict& state, const std::string& checkpoint_dir);

// What async_save does when the writer still has a save in flight.
enum class PendingSave {
  kWait,    // wait for it on the caller's thread, then stage (the default)
  kReject,  // throw Error at once
};

struct AsyncSaveOptions {
  TORCH_ARG(PendingSave, if_save_pending) = PendingSave::kWait;
};

// PyTorch returns this only when staging itself is asynchronous, and the upload future
// alone otherwise. Here there is one type: when staging is synchronous,
// staging_completion is ready on return.
struct AsyncSaveResponse {
  // Ready once the snapshot is complete: from then on the source may change.
  std::shared_future<void> staging_completion;
  // Ready once the checkpoint is committed (its metadata) or the save failed (the
  // error, rethrown by get()).
  std::shared_future<Metadata> upload_completion;
};

// Stages `state` with `stager` (else the writer, if it is an AsyncStager, else a
// blocking uncached CPU copy) and writes the snapshot on a background thread.
// Validation errors of the state dict are thrown here; errors of the write reach
// upload_completion. Stateful values are turned into state dicts on this thread. When
// the stager stages synchronously and asks for it (should_synchronize_after_execute),
// its synchronize_staging() is called after the write has started. One save per writer
// is in flight at a time (see AsyncSaveOptions); the writer must outlive the save and
// its destructor waits for it.
AsyncSaveResponse async_save(const StateDict& state, StorageWriter& writer, AsyncStager* stager = nullptr,
                             AsyncSaveOptions options = {});

struct LoadOptions {
  // Leave entries the checkpoint lacks as they are, instead of failing.
  TORCH_ARG(bool, allow_partial_load) = false;
};

// Loads into `state` in place: every tensor is filled where it lies (on its device),
// every other leaf replaced. Entries the checkpoint has but `state` lacks are ignored,
// except under a Stateful's key, where they are materialised on the CPU and handed to
// its load_state_dict (a fresh optimizer gains its saved state). Everything is read
// and verified before the first change: on an exception (a missing key, a shape or
// dtype mismatch, a corrupt, short or missing file) `state` is unchanged.
void load(StateDict& state, StorageReader& reader, LoadOptions options = {});
void load(StateDict& state, const std::string& checkpoint_dir, LoadOptions options = {});

}  // namespace stowage::dcp
