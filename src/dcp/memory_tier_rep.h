#pragma once

// The state a MemoryTier keeps (memory_tier.cpp: saving; memory_tier_restore.cpp:
// recovery), and the directory listing both use.

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/memory_tier.h>

#include "dcp/memory_tier_pages.h"

#include <cstdint>
#include <exception>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace stowage::dcp {

// The committed steps one rank holds in memory; restore() drops a step from it when its
// copy fails to load.
struct RankListing {
  std::set<int64_t> own;
  std::set<int64_t> held;  // the replicas of its source
};

// A replication running on the tier's thread: its step, and its outcome to come (this
// rank's seconds and failure, empty when none).
struct ReplicationInFlight {
  int64_t step = 0;
  std::future<std::pair<double, std::string>> outcome;
};

struct MemoryTier::Rep {
  MemoryTierOptions options;
  NodeLayout layout;
  std::optional<dist::ProcessGroup> group;
  // The lanes of its transfers (checkpoint_transfer.h): groups over the same ranks, so
  // that a replication's exchanges, on the tier's thread, never meet the caller's
  // collectives on `group`. Only with a peer.
  std::vector<dist::ProcessGroup> transfer_lanes;
  std::optional<ReplicationInFlight> replicating;
  int64_t rank = 0;
  int64_t world_size = 1;
  // The Envs of its own checkpoints and of the replicas it holds, over options.env():
  // the pages of those they drop are written over by the next ones (memory_tier_pages.h).
  std::unique_ptr<PageRecycler> own_pages;
  std::unique_ptr<PageRecycler> replica_pages;  // with a peer

  Env& env() const { return *options.env(); }
  // <directory>/node-<N>.
  std::string node_directory() const;
  // <node directory>/rank-<R>-of-<W>: this rank's own checkpoints.
  std::string own_directory() const;
  // <node directory>/replica-of-rank-<Q>-of-<W>: the replicas of `source` it holds.
  std::string replica_directory(int64_t source) const;
  // The checkpoints of `step` in those two.
  std::string own_path(int64_t step) const;
  std::string replica_path(int64_t source, int64_t step) const;
  // The ranks a rank's replica goes to and comes from: ±ranks_per_node, modulo W.
  std::optional<int64_t> peer_of(int64_t rank) const;
  std::optional<int64_t> source_of(int64_t rank) const;

  // On the tier's thread: sends this rank's checkpoint of `step` to its peer, keeps its
  // source's as a replica, and prunes the replicas. Returns its seconds and its failure.
  // REQUIRES: own_path(step) is committed and stays until it returns.
  std::pair<double, std::string> replicate(int64_t step) const;
  // Waits for the replication in flight; its report, this rank's failure alone.
  std::optional<ReplicationReport> wait_for_replication();
  // The same, its failure agreed (collective with a group).
  std::optional<ReplicationReport> finish_replication();

  // Every rank's `text`, indexed by rank (this rank's alone without a group).
  std::vector<std::string> all_gather(const std::string& text) const;
  // The first rank's non-empty `error` ("rank R: ..."), the same on every rank.
  std::string agreed_error(const std::string& error) const;

  // memory_tier_restore.cpp.
  // The newest step that every rank has, itself or at its peer; nothing if none.
  std::optional<int64_t> newest_common_step(const std::vector<RankListing>& listings) const;
  // Every rank without its own `step` fetches it from its peer, then every rank loads
  // its own (dcp::load checks every chunk's checksum before it changes the state).
  // Returns whether every rank loaded; else adds each failure to result.skipped and drops
  // the copy that failed from `listings` (a rank's own, or the replica its peer holds),
  // the same on every rank. A rank that loaded has its state changed.
  bool load_from_memory(int64_t step, std::vector<RankListing>& listings, StateDict& state,
                        const LoadOptions& load_options, TierRestore& result) const;
  // Collective, with a group: each rank holding the replica of `step` that its source
  // lacks sends it back, and a rank lacking its own receives it into its own directory
  // (checkpoint_transfer.h).
  // Returns whether this rank now has its own copy; sets `failure` (as load_from_memory
  // exchanges it) when a copy this rank sent or received failed.
  bool fetch_missing(int64_t step, const std::vector<RankListing>& listings, std::string& failure) const;
  // The failure line of this rank's fetched copy of `step`, which failed for `why`.
  std::string fetched_failure(int64_t step, const std::string& why) const;
};

// The steps of the committed checkpoints of stowage's format among `checkpoints`, in
// their order (list_checkpoints: oldest first).
std::vector<int64_t> committed_stowage_steps(const std::vector<ManagedCheckpoint>& checkpoints);

}  // namespace stowage::dcp
