#pragma once

// The memory tier's benchmark (issue 40, item 6): on one state per rank, a save into the
// memory tier (dcp::MemoryTier: the node's /dev/shm, then replicated to the peer node)
// against a save to storage (dcp::CheckpointManager to a directory on disk, fsync'd, as
// `stowage train` saves); recovery from each rank's own memory, from a peer's replica
// (node 1's ranks lose their own copies, as a lost node does) and from storage read cold
// (every file fsync'd, then dropped from the page cache with
// posix_fadvise(POSIX_FADV_DONTNEED), and mincore() asked how much of it is still
// resident); the steps a failure loses at each interval, and the host bytes the tier
// holds.

#include <stowage/dist/process_group.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::bench {

struct MemoryTierBenchOptions {
  int64_t size_mib = 256;      // each rank's state
  int64_t tensors = 32;        // it is split into this many float tensors
  int rounds = 3;              // saves and restores of each kind (medians reported)
  std::string storage_dir;     // the storage's parent directory; empty: the system temp directory
  std::string memory_dir;      // the tier's parent directory; empty: /dev/shm
  int64_t storage_every = 50;  // M: the storage interval the steps lost are stated for
  std::vector<int64_t> memory_every = {1, 5, 10, 25};  // K: the memory intervals
};

// The steps a failure at a uniformly random step loses, with saves every `every` steps:
// it loses the steps since the last save, t mod K for a failure after step t, whose mean
// is (K - 1) / 2.
double mean_steps_lost(int64_t every);

struct MemoryTierBenchResult {
  int64_t ranks = 0;
  int64_t ranks_per_node = 0;
  int64_t bytes_per_rank = 0;  // the state's tensors
  // Each time is the slowest rank's, the median of the rounds.
  double memory_save_s = 0;        // MemoryTier::save: the caller blocked, its own copy committed
  double memory_replicate_s = 0;   // the replication that follows in the background
  double memory_replicated_s = 0;  // from save() until every replica is committed
  double storage_block_s = 0;      // CheckpointManager::save + wait_for_staging: the caller blocked
  double storage_commit_s = 0;     // from save() until committed (fsync'd)
  double restore_memory_s = 0;     // MemoryTier::restore, every rank from its own memory
  double restore_replica_s = 0;    // node 1's ranks from node 0's replicas
  double restore_storage_s = 0;    // from storage, its files out of the page cache
  // Of the storage checkpoint's pages, the largest fraction still in the page cache right
  // before a cold restore (mincore; 0: cold).
  double storage_resident_fraction = 0;
  // Bytes in the tier's directories after a save, all nodes: own checkpoints and replicas
  // (keep_last of each).
  int64_t memory_host_bytes = 0;
  int64_t storage_every = 0;
  std::vector<int64_t> memory_every;

  // All ranks' bytes over the slowest rank's time.
  double memory_save_gbps() const;        // to the own copies' commit
  double memory_replicated_gbps() const;  // to the replicas' commit
  double storage_save_gbps() const;       // to commit
  // The ratios the 5x targets judge; 0 when a time is.
  double save_ratio() const;             // memory_save_gbps / storage_save_gbps
  double replicated_save_ratio() const;  // memory_replicated_gbps / storage_save_gbps
  double memory_restore_ratio() const;   // restore_storage_s / restore_memory_s
  double replica_restore_ratio() const;  // restore_storage_s / restore_replica_s
};

// Collective: every rank of `group` calls it with the same options and directories (one
// memory directory for the job, its nodes below it; one storage directory). The node
// layout is the environment's (dcp::node_layout_from_env): ≥ 2 nodes for replicas.
// Throws stowage::Error when a restore comes from another tier than the one measured.
MemoryTierBenchResult run_memory_tier_rank(const MemoryTierBenchOptions& options, const std::string& memory_dir,
                                           const std::string& storage_dir, const dist::ProcessGroup& group);

nlohmann::json to_json(const MemoryTierBenchResult& result);
MemoryTierBenchResult memory_tier_result_from_json(const nlohmann::json& json);
// Human-readable lines, with each target (≥ 5x) and whether it is met.
std::string to_text(const MemoryTierBenchResult& result);

}  // namespace stowage::bench
