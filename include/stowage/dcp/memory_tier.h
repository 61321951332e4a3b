#pragma once

// A checkpoint tier in host memory, replicated to a peer node (issue 40; Gemini's and
// ML Flashpoint's idea): every save_every steps each rank saves its own state (the
// model, its share of the optimizer, the progress) with dcp::save, without a group, into
// a directory of its node, by default under /dev/shm, which outlives the processes, so
// that a restart of the job finds it. Each rank's checkpoint is then sent to its peer,
// which keeps it as a replica in its own node's directory: in the background, on a
// thread of the tier's, over two process groups of its own (made with the job's), in
// pieces that never hold a whole checkpoint in memory, while training goes on.
//
//   dcp::MemoryTier memory(dcp::MemoryTierOptions("/dev/shm/stowage-run").save_every(5),
//                          dcp::node_layout_from_env(world.size), group);
//   const dcp::TierRestore restored = memory.restore(state, storage_manager);
//   for (...) {
//     ... the step ...
//     if (memory.should_save(step)) memory.save(step, state);   // returns once in memory
//     storage_manager.save(step, state);                        // every M steps, as before
//   }
//   memory.finish_replication();                                // the last save's replica
//
// Layout: <directory>/node-<N>/rank-<R>-of-<W>/step-<S> (rank R's own checkpoints) and
// <directory>/node-<N>/replica-of-rank-<Q>-of-<W>/step-<S> (the replicas rank R holds),
// each a checkpoint of stowage's format (docs/FORMAT.md): committed once its metadata
// file is there, written last, its chunks checked against their checksums when read.
// A half-written checkpoint (no metadata) is never restored, and is removed by the next
// save. Each rank keeps its newest keep_last own checkpoints and replicas.
//
// The peer rule: rank R's replica is held by rank (R + ranks_per_node) mod W, the same
// local rank on the next node of a ring over the nodes. With one node there is no peer,
// and nothing is replicated. One replication is in flight at most: a save waits for the
// previous one's before it begins. So a lost node's ranks resume from the newest step
// their peers had committed, which may be the save before the newest one of their own.
//
// Recovery (restore): every rank lists the committed steps it can restore itself (its
// own checkpoints) and those it holds for its source rank (the replicas); a half-written
// one is not listed. The ranks agree (an all-gather) on the newest step that every rank
// can get, from its own memory or from its peer; if that step is at least as new as the
// storage's newest committed checkpoint, a rank without its own copy fetches it from its
// peer (into its own directory, committed as any), and every rank loads its own, which
// checks every chunk against its checksum before it changes the state. A copy that fails
// (corrupt, truncated, unreadable) is never loaded: it is dropped and the ranks agree
// again, on the same step from the other copy or on an older one; when none is left,
// every rank restores from storage (CheckpointManager::restore). Only the step restored
// is read (each rank's part once), however many the tier keeps. A job of
// another world size finds no checkpoint of its own (the directory names W), and goes
// through storage, which reshards.
//
// Faults (docs/reliability.md): a lost process restarts from its own memory; a lost
// node (its processes and its directory) from its peers' replicas; a node and its peer
// both lost, from storage.
//
// Thread safety: one thread calls a MemoryTier. With a group every call is collective:
// every rank makes the tier, saves and restores together, in the same order (the
// replication's own groups keep its exchanges apart from the caller's collectives).

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/env.h>
#include <stowage/dist/process_group.h>
#include <stowage/state/state_dict.h>

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp {

// Where this rank's node is in the job: the node's number and how many ranks each node
// runs (every node alike).
struct NodeLayout {
  int64_t node = 0;
  int64_t ranks_per_node = 1;
};

// The layout torchrun and `stowage launch` describe: GROUP_RANK (the node; 0 when unset)
// and LOCAL_WORLD_SIZE (the ranks per node; `world_size` when unset). Throws
// InvalidArgument naming a variable that is not a non-negative integer, or a
// LOCAL_WORLD_SIZE that does not divide `world_size`.
NodeLayout node_layout_from_env(int64_t world_size);

struct MemoryTierOptions {
  MemoryTierOptions() = default;
  explicit MemoryTierOptions(std::string directory) : directory_(std::move(directory)) {}

  // The root of the nodes' directories (node-<N> under it); e.g. /dev/shm/stowage-<run>.
  TORCH_ARG(std::string, directory) = "";
  // should_save() is true at the steps that are multiples of this; 0: the tier is off.
  TORCH_ARG(int64_t, save_every) = 0;
  // Own checkpoints and replicas each rank keeps, the newest ones: 1 or 2.
  TORCH_ARG(int64_t, keep_last) = 2;
  // Every file-system call goes through it (env.h); it must outlive the tier.
  TORCH_ARG(EnvPointer, env) = Env::posix();
};

// The checks of a MemoryTier's construction: InvalidArgument naming a negative
// save_every, a keep_last other than 1 or 2, an empty directory (with save_every > 0) or
// a null env.
void check_memory_tier_options(const MemoryTierOptions& options);

// A save's replication to the peers, the same on every rank (agreed).
struct ReplicationReport {
  int64_t step = 0;
  // On this rank, from the start of the replication (its own checkpoint committed) until
  // the replica it holds is committed: the exchange with the peers and the replica's write.
  double replicate_s = 0;
  // The first rank's failure ("rank 2: ..."), empty when every rank's checkpoint reached
  // its peer. A failed replication leaves the replicas held before as they were.
  std::string error;
};

// A memory save, the same on every rank (agreed).
struct MemorySaveReport {
  int64_t step = 0;
  int64_t bytes = 0;  // this rank's checkpoint
  double save_s = 0;  // this rank's write into memory: what the caller waits for
  // The first rank's failure ("rank 2: ..."), empty when every rank saved. A failed save
  // leaves the older checkpoints as they were, and replicates nothing.
  std::string error;
  // The previous save's replication, which this save waited for before it began: none
  // at the first save, nor on one node.
  std::optional<ReplicationReport> previous_replication;
};

// Where a restore came from.
enum class RestoreTier {
  kNone,         // nothing to restore: the state is unchanged
  kMemory,       // every rank from its own memory
  kPeerReplica,  // some ranks fetched their checkpoint from their peer's replica
  kStorage,      // from the storage's checkpoints (CheckpointManager::restore)
};

// "none", "memory", "peer replica", "storage": for messages and metrics.
const char* restore_tier_name(RestoreTier tier);

struct TierRestore {
  std::optional<int64_t> step;
  RestoreTier tier = RestoreTier::kNone;
  std::vector<int64_t> fetched_ranks;  // kPeerReplica: the ranks that fetched their part
  // What was passed over, one line each, the same on every rank: each memory checkpoint
  // that failed to load (a rank's own, a replica held, a copy fetched), and the storage's
  // skipped checkpoints.
  std::vector<std::string> skipped;
};

class MemoryTier {
 public:
  // Makes this rank's directories. Throws what check_memory_tier_options throws, and
  // InvalidArgument for a layout that does not fit the group (ranks_per_node not
  // dividing its size, a node beyond it). Collective with a group.
  MemoryTier(MemoryTierOptions options, NodeLayout layout, std::optional<dist::ProcessGroup> group = std::nullopt);
  ~MemoryTier();  // waits for a replication in flight
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  // <directory>/node-<N>.
  std::string node_directory() const;
  // This rank's own checkpoint of `step`, and the replica it holds of its source's.
  std::string own_path(int64_t step) const;
  std::string replica_path(int64_t step) const;
  // The rank that holds this rank's replica, and the rank whose replica this one holds;
  // nothing with one node.
  std::optional<int64_t> peer() const;
  std::optional<int64_t> source() const;

  bool should_save(int64_t step) const;
  // Waits for the previous save's replication (reported in the result), saves `state` as
  // `step` into this rank's memory, prunes, and returns once that copy is committed; its
  // replication (the checkpoint sent to the peer, the source's kept as a replica) then
  // runs in the background. A failure (e.g. the memory's file system full) is reported,
  // the same on every rank, never thrown. Collective with a group.
  // REQUIRES: `state` does not change until it returns.
  MemorySaveReport save(int64_t step, const StateDict& state);

  // Waits for the last save's replication, when one is in flight, and reports it.
  // Collective with a group. The destructor, restore() and clear() wait for it too, and
  // drop its report.
  std::optional<ReplicationReport> finish_replication();

  // Restores the newest step every rank can get (see above), from memory, a peer's
  // replica or `storage`. Throws what storage.restore throws when it comes to it.
  TierRestore restore(StateDict& state, CheckpointManager& storage, LoadOptions options = {});

  // Removes this rank's own checkpoints and the replicas it holds (a run that ended).
  void clear();
  // The host memory a replication holds on a rank besides the tier's files, at most: its
  // buffers for sending a checkpoint of `own_bytes` and receiving one of `replica_bytes`
  // (pieces of each, never a whole one), counted as memory::HostBufferUse::kCheckpoint.
  static int64_t replication_buffer_bytes(int64_t own_bytes, int64_t replica_bytes);

  // The bytes of the files of this rank's own checkpoints and of the replicas it holds
  // (spare pages included), as the file system reports them now: the host memory the
  // tier takes on this rank. Not collective: a replication may be writing meanwhile.
  int64_t held_bytes() const;

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace stowage::dcp
