#pragma once

// The state a MemoryTier keeps (memory_tier.cpp: saving; memory_tier_restore.cpp:
// recovery), and the directory listing both use.

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/memory_tier.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace stowage::dcp {

// The verified steps one rank can restore from memory.
struct RankListing {
  std::set<int64_t> own;
  std::set<int64_t> held;  // the replicas of its source
};

struct MemoryTier::Rep {
  MemoryTierOptions options;
  NodeLayout layout;
  std::optional<dist::ProcessGroup> group;
  int64_t rank = 0;
  int64_t world_size = 1;

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

  // Every rank's `text`, indexed by rank (this rank's alone without a group).
  std::vector<std::string> all_gather(const std::string& text) const;
  // The first rank's non-empty `error` ("rank R: ..."), the same on every rank.
  std::string agreed_error(const std::string& error) const;
  // Sends `bytes` (given on `sender`) to `receiver`, which returns them; others get "".
  // Collective: every rank calls it with the same sender and receiver.
  std::string send_to(int64_t sender, int64_t receiver, const std::string& bytes) const;

  // memory_tier_restore.cpp.
  // The newest step that every rank has, itself or at its peer; nothing if none.
  std::optional<int64_t> newest_common_step(const std::vector<RankListing>& listings) const;
  // Every rank without its own `step` fetches it from its peer, then every rank loads
  // its own. Returns whether every rank loaded; else adds the first failure to
  // result.skipped (a rank that loaded has its state changed).
  bool load_from_memory(int64_t step, const std::vector<RankListing>& listings, StateDict& state,
                        const LoadOptions& load_options, TierRestore& result) const;
};

// The steps of the committed checkpoints of stowage's format among `checkpoints`, in
// their order (list_checkpoints: oldest first).
std::vector<int64_t> committed_stowage_steps(const std::vector<ManagedCheckpoint>& checkpoints);

}  // namespace stowage::dcp
