#pragma once

// What a directory holds, as anything handed one sees it: one checkpoint (stowage's or
// PyTorch DCP's), a directory of step-<N> checkpoints (a CheckpointManager's, whatever its
// name), or a run directory (a train::Trainer's: its checkpoints in checkpoints/); and
// which of its checkpoints is the latest committed. CheckpointManager, `stowage ckpt`,
// open_checkpoint and the run directory's checks all ask here.
//
//   const dcp::CheckpointDirectory held = dcp::describe_directory(dir);
//   const dcp::ReadableCheckpoint latest = dcp::checkpoint_to_read(held);
//   auto reader = dcp::open_checkpoint(latest.path);  // interop: the reader of its format
//
// A checkpoint of either format is committed once its metadata file is there: each
// writer writes it last. That file's name is all this model knows of a format; reading
// one is FileSystemReader's (stowage) or the interop library's TorchDcpReader (PyTorch
// DCP), so that the layers below interop (the manager, train) see both formats alike.

#include <stowage/dcp/env.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp {

// The name of PyTorch DCP's metadata file; its presence commits the checkpoint.
inline constexpr const char* kTorchDcpMetadataFileName = ".metadata";
// The folder of a run directory that holds its step-<N> checkpoints.
inline constexpr const char* kRunCheckpointsFolder = "checkpoints";

// The formats a committed checkpoint may be in.
enum class CheckpointFormat {
  kStowage,     // kMetadataFileName (metadata.h)
  kPyTorchDcp,  // kTorchDcpMetadataFileName
};

// "stowage" or "pytorch-dcp".
const char* format_name(CheckpointFormat format);

// The format of the checkpoint committed in `path`, or nothing when neither metadata
// file is there (not a checkpoint, or one not committed). IoError when it cannot be
// looked at.
std::optional<CheckpointFormat> committed_format(const std::string& path, Env& env = *Env::posix());

// step-<N>: the name of step N's checkpoint in a directory of them, N written with
// eight digits at least.
std::string step_directory_name(int64_t step);
// N of a name step-<N> (digits only), or nothing.
std::optional<int64_t> step_of_directory_name(const std::string& name);

// A step-<N> checkpoint of a directory of them.
struct ManagedCheckpoint {
  int64_t step = 0;
  std::string path;
  bool committed = false;
  CheckpointFormat format = CheckpointFormat::kStowage;  // when committed
};

// Removes the checkpoint directory `path`, committed or not, so that no moment of the
// removal shows a committed checkpoint with files missing, should the process die in it:
// uncommit_checkpoint first, then the rest. Nothing when `path` does not exist. IoError
// naming the call that failed.
void remove_checkpoint(const std::string& path, Env& env = *Env::posix());
// The first half of that: its commit (the metadata file of either format) removed, made
// durable. The checkpoint is then a half-written one, which no load takes.
void uncommit_checkpoint(const std::string& path, Env& env = *Env::posix());

// Every step-<N> directory of `directory`, oldest first (none if it does not exist;
// IoError if it cannot be listed). Changes nothing, unlike a CheckpointManager's
// construction.
std::vector<ManagedCheckpoint> list_checkpoints(const std::string& directory, Env& env = *Env::posix());

// The newest committed one of `checkpoints` (oldest first, as list_checkpoints gives
// them), or nothing when none is.
std::optional<ManagedCheckpoint> latest_committed(const std::vector<ManagedCheckpoint>& checkpoints);

enum class DirectoryKind {
  kCheckpoint,   // one committed checkpoint
  kCheckpoints,  // a directory of step-<N> checkpoints
  kRun,          // a run directory: its step-<N> checkpoints are in kRunCheckpointsFolder
};

// "checkpoint", "directory of checkpoints" or "run directory": for messages.
const char* describe(DirectoryKind kind);

// What a directory holds.
struct CheckpointDirectory {
  std::string path;  // as given
  DirectoryKind kind = DirectoryKind::kCheckpoint;
  CheckpointFormat format = CheckpointFormat::kStowage;  // kCheckpoint: the checkpoint's
  std::string checkpoints;                               // kCheckpoints: `path`; kRun: <path>/checkpoints
  std::vector<ManagedCheckpoint> listed;                 // kCheckpoints, kRun: list_checkpoints(checkpoints)
};

// What `path` holds, in this order: a committed checkpoint; a run directory (one with a
// checkpoints/ folder); a directory of step-<N> checkpoints (one holding such a
// directory, committed or not, or named checkpoints: a run's before its first save).
// Throws InvalidArgument naming `path` and these three when it is none of them, or is
// not a directory (saying whether it is absent, and whether its step-<N> name makes it
// a checkpoint not committed); IoError when it cannot be looked at.
CheckpointDirectory describe_directory(const std::string& path, Env& env = *Env::posix());

// The checkpoint a reader of a directory reads.
struct ReadableCheckpoint {
  std::string path;
  CheckpointFormat format = CheckpointFormat::kStowage;
  std::optional<int64_t> step;  // its N, when it is the latest of a directory of them
};

// The directory itself when it is a checkpoint, else its latest committed checkpoint.
// Throws InvalidArgument naming the directory and what it holds when it has none.
ReadableCheckpoint checkpoint_to_read(const CheckpointDirectory& directory);

}  // namespace stowage::dcp
