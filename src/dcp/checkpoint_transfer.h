#pragma once

// A committed checkpoint directory sent to another rank, which writes it into a directory
// of its own under the same commit rule: the memory tier's replicas, and their way back
// to a rank that lost its own.
//
// On the wire, over `lanes` (groups over the same ranks):
//  1. a header (ProcessGroup::shift): each file's name and length, the metadata last; no
//     file when the sender has nothing to send;
//  2. the files' bytes as one stream cut into pieces, piece k over lanes[k % lanes],
//     each lane on a thread of its own (one lane's piece is written while another's
//     crosses). Each lane reads a piece into, or receives it into, a buffer of its own,
//     so a transfer holds at most 2 x lanes x piece_bytes of host memory on a rank, never
//     a checkpoint's worth (transfer_buffer_bytes);
//  3. a status (shift): the sender's read failure, if any. The receiver commits (the
//     metadata, received last, written under a temporary name renamed into place) only
//     when every byte was read, received and written.
// A failure part way never stops a side early: the pieces still cross (nothing hangs),
// and the receiver commits nothing.

#include <stowage/dcp/env.h>
#include <stowage/dist/process_group.h>

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp {

// One rank's side of a transfer: the checkpoint it sends to rank `to`, and where the one
// rank `from` sends lands. A rank with neither takes part in the header and the status
// alone.
struct CheckpointTransfer {
  TORCH_ARG(std::optional<std::string>, send_path);  // a committed checkpoint
  TORCH_ARG(int64_t, to) = 0;
  TORCH_ARG(std::optional<std::string>, receive_path);  // replaced when a checkpoint comes
  TORCH_ARG(int64_t, from) = 0;
  // The size of a piece; tests make it small to cut a checkpoint into many.
  TORCH_ARG(int64_t, piece_bytes) = int64_t(16) << 20;
};

// What a transfer did on this rank.
struct TransferOutcome {
  // This rank's checkpoint could not be read: `to` commits nothing (or, when it failed
  // before the header, receives nothing).
  std::string send_error;
  // Whether `from` sent a checkpoint, and whether it was committed at receive_path.
  bool came = false;
  bool committed = false;
  // Why a checkpoint that came was not committed: the sender's read, the header, or this
  // rank's writes (an uncommitted directory is left, as a torn write leaves one).
  std::string receive_error;
};

// The host memory a transfer holds on a rank (its lanes' buffers, counted as
// memory::HostBufferUse::kCheckpoint) when it sends a checkpoint of `out_bytes` and
// receives one of `in_bytes`.
int64_t transfer_buffer_bytes(int64_t lanes, int64_t piece_bytes, int64_t out_bytes, int64_t in_bytes);

// Collective over `lanes`: every rank calls it, each with its own `to` and `from`, which
// pair up as in ProcessGroup::shift. Files are read and made through `env`. Throws
// InvalidArgument for no lane or a piece_bytes < 1, and CollectiveError as the groups
// throw it; every other failure is in the outcome.
TransferOutcome transfer_checkpoint(const CheckpointTransfer& transfer, const std::vector<dist::ProcessGroup>& lanes,
                                    Env& env);

}  // namespace stowage::dcp
