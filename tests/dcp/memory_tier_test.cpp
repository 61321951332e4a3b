// The memory tier (issue 40): each rank's checkpoints in a node's directory, replicated to
// the same local rank of the next node, and recovery from the newest step every rank can
// get — its own memory, its peer's replica, or storage. Ranks run as threads; "nodes"
// are directories (node-<N>) under one scratch root, and a lost node is one removed.

#include "dcp/memory_tier_copies.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/memory_tier.h>
#include <stowage/error.h>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp::testing {
namespace {
namespace fs = std::filesystem;

// A job of the tier: its ranks, so many on each node.
struct TierJob {
  int64_t ranks = 4;
  int64_t ranks_per_node = 2;

  NodeLayout layout_of(int64_t rank) const { return NodeLayout{rank / ranks_per_node, ranks_per_node}; }
  std::vector<int64_t> ranks_of_node(int64_t node) const {
    std::vector<int64_t> ranks_on_it;
    for (int64_t local = 0; local < ranks_per_node; ++local) ranks_on_it.push_back(node * ranks_per_node + local);
    return ranks_on_it;
  }
};

constexpr TierJob kTwoNodesOfTwoRanks{4, 2};
// A ring of three nodes, where a rank's peer (the next node's) and its source (the
// previous node's) are different ranks: a replica sent or fetched the wrong way round
// the ring shows.
constexpr TierJob kThreeNodesOfOneRank{3, 1};
constexpr TierJob kThreeNodesOfTwoRanks{6, 2};

// A rank's state at a step: values only that rank at that step has.
StateDict memory_tier_state(int64_t rank, int64_t step) {
  return state_of(
      {{fmt::format("weights-{}", rank), at::full({4096}, static_cast<double>(rank * 1000 + step), at::kFloat)},
       {"step", c10::IValue(step)}});
}

StateDict empty_memory_tier_state(int64_t rank) {
  return state_of(
      {{fmt::format("weights-{}", rank), at::zeros({4096}, at::kFloat)}, {"step", c10::IValue(int64_t(0))}});
}

void expect_memory_tier_state(const StateDict& state, int64_t rank, int64_t step) {
  EXPECT_EQ(state.at("step").toInt(), step) << "rank " << rank;
  const std::string key = fmt::format("weights-{}", rank);
  EXPECT_TRUE(state.at(key).toTensor().equal(memory_tier_state(rank, step).at(key).toTensor()))
      << "rank " << rank << " holds " << state.at(key).toTensor()[0].item<float>();
}

// Saves `steps` into the memory tier on every rank of `job` and `storage_step` into
// storage.
void train_tier_job(const ScratchDir& dir, const TierJob& job, const std::vector<int64_t>& steps,
                    int64_t storage_step) {
  stowage::testing::run_ranks(job.ranks, [&](const dist::ProcessGroup& group) {
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1), job.layout_of(group.rank()), group);
    CheckpointManager storage(dir.sub("storage"), CheckpointManagerOptions(), group);
    for (const int64_t step : steps) {
      const MemorySaveReport report = tier.save(step, memory_tier_state(group.rank(), step));
      ASSERT_EQ(report.error, "");
      if (step == storage_step) storage.save_now(step, memory_tier_state(group.rank(), step));
    }
  });
}

// Restores on every rank of `job` with fresh tiers, each rank expecting its state of
// `expected_step`; every rank's result.
std::vector<TierRestore> restore_tier_job(const ScratchDir& dir, const TierJob& job, int64_t expected_step) {
  std::vector<TierRestore> results(static_cast<size_t>(job.ranks));
  stowage::testing::run_ranks(job.ranks, [&](const dist::ProcessGroup& group) {
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1), job.layout_of(group.rank()), group);
    CheckpointManager storage(dir.sub("storage"), CheckpointManagerOptions(), group);
    StateDict state = empty_memory_tier_state(group.rank());
    results[static_cast<size_t>(group.rank())] = tier.restore(state, storage);
    expect_memory_tier_state(state, group.rank(), expected_step);
  });
  return results;
}

// The replica of rank `of`'s `step` that `node` holds.
std::string replica_dir(const ScratchDir& dir, const TierJob& job, int64_t node, int64_t of, int64_t step) {
  return stowage::testing::memory_replica_path(dir.sub("memory"), node, of, job.ranks, step);
}

// Flips one bit in the middle of the checkpoint's first data file: a copy its checksums
// must catch.
void flip_a_data_byte(const std::string& checkpoint) {
  const std::string data = checkpoint + "/" + data_files(checkpoint).at(0);
  std::string bytes = read_file(data);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file(data, bytes);
}

// Whether `line` names the replica of rank `of` at `step` that rank `holder` holds at
// `path`: by that path, or in words ("the replica of rank 1 at step 6 on rank 2").
::testing::AssertionResult names_replica(const std::string& line, int64_t of, int64_t step, int64_t holder,
                                         const std::string& path) {
  if (line.find(path) != std::string::npos ||
      line.find(fmt::format("the replica of rank {} at step {} on rank {}", of, step, holder)) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "\"" << line << "\" names neither " << path << " nor rank " << holder
                                       << "'s replica of rank " << of << " at step " << step;
}

TEST(MemoryTier, OneRankRestoresItsNewestMemoryStepNotTheOlderStorageOneAndKeepsTwo) {
  const ScratchDir dir;
  CheckpointManager storage(dir.sub("storage"));
  {
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(2), NodeLayout{});
    EXPECT_FALSE(tier.peer());  // one node: nothing to replicate to
    for (const int64_t step : {2, 4, 6}) {
      if (step == 2) storage.save_now(step, memory_tier_state(0, step));
      EXPECT_EQ(tier.save(step, memory_tier_state(0, step)).error, "");
    }
    std::vector<int64_t> kept;
    for (const ManagedCheckpoint& checkpoint : list_checkpoints(fs::path(tier.own_path(6)).parent_path().string())) {
      kept.push_back(checkpoint.step);
    }
    EXPECT_EQ(kept, (std::vector<int64_t>{4, 6}));
  }
  MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(2), NodeLayout{});
  StateDict state = empty_memory_tier_state(0);
  const TierRestore restored = tier.restore(state, storage);
  EXPECT_EQ(restored.tier, RestoreTier::kMemory);
  EXPECT_EQ(restored.step, 6);
  expect_memory_tier_state(state, 0, 6);
}

TEST(MemoryTier, ATornLocalWriteIsNeverRestoredAndTheNextSaveRemovesIt) {
  const ScratchDir dir;
  CheckpointManager storage(dir.sub("storage"));
  MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(2), NodeLayout{});
  ASSERT_EQ(tier.save(2, memory_tier_state(0, 2)).error, "");
  ASSERT_EQ(tier.save(4, memory_tier_state(0, 4)).error, "");
  // Step 6 died mid-write: its data is there, its metadata (written last) is not, or
  // only half of it.
  fs::copy(tier.own_path(4), tier.own_path(6));
  fs::remove(metadata_path(tier.own_path(6)));
  fs::copy(tier.own_path(4), tier.own_path(8));
  const std::string metadata = read_file(metadata_path(tier.own_path(8)));
  write_file(metadata_path(tier.own_path(8)), metadata.substr(0, metadata.size() / 2));

  StateDict state = empty_memory_tier_state(0);
  const TierRestore restored = tier.restore(state, storage);
  EXPECT_EQ(restored.step, 4);
  EXPECT_EQ(restored.tier, RestoreTier::kMemory);
  expect_memory_tier_state(state, 0, 4);
  ASSERT_EQ(restored.skipped.size(), 1u);  // the half-committed one failed to load
  EXPECT_NE(restored.skipped[0].find(tier.own_path(8)), std::string::npos) << restored.skipped[0];

  ASSERT_EQ(tier.save(10, memory_tier_state(0, 10)).error, "");
  EXPECT_FALSE(fs::exists(tier.own_path(6)));  // uncommitted: gone
  ASSERT_EQ(tier.save(12, memory_tier_state(0, 12)).error, "");
  EXPECT_FALSE(fs::exists(tier.own_path(8)));  // "committed", never restored, and aged out
}

TEST(MemoryTier, ALostNodeResumesFromItsPeersReplicasAtTheLastMemoryStep) {
  const ScratchDir dir;
  train_tier_job(dir, kTwoNodesOfTwoRanks, {2, 4, 6}, 2);
  // Ranks 2 and 3 keep their replicas on node 0 (ranks 0 and 1), and the other way round.
  EXPECT_TRUE(fs::exists(metadata_path(replica_dir(dir, kTwoNodesOfTwoRanks, 0, 2, 6))));
  EXPECT_TRUE(fs::exists(metadata_path(replica_dir(dir, kTwoNodesOfTwoRanks, 1, 0, 6))));
  fs::remove_all(dir.sub("memory/node-1"));  // node 1 is lost, with its memory

  const std::vector<TierRestore> results = restore_tier_job(dir, kTwoNodesOfTwoRanks, 6);
  for (const TierRestore& result : results) {
    EXPECT_EQ(result.step, 6);
    EXPECT_EQ(result.tier, RestoreTier::kPeerReplica);
    EXPECT_EQ(result.fetched_ranks, (std::vector<int64_t>{2, 3}));
  }
  // The fetched checkpoints are node 1's own again: a second restart needs no peer.
  EXPECT_EQ(restore_tier_job(dir, kTwoNodesOfTwoRanks, 6)[0].tier, RestoreTier::kMemory);
}

TEST(MemoryTier, ACorruptReplicaIsSkippedNeverLoaded) {
  const ScratchDir dir;
  train_tier_job(dir, kTwoNodesOfTwoRanks, {2, 4}, 2);
  // Rank 0 holds rank 2's replica; one byte of step 4's data flips.
  flip_a_data_byte(replica_dir(dir, kTwoNodesOfTwoRanks, 0, 2, 4));
  fs::remove_all(dir.sub("memory/node-1"));

  // Rank 2 can get step 2 only: the job takes step 2, every rank, from memory and replicas.
  const std::vector<TierRestore> results = restore_tier_job(dir, kTwoNodesOfTwoRanks, 2);
  EXPECT_EQ(results[0].step, 2);
  EXPECT_EQ(results[0].tier, RestoreTier::kPeerReplica);
  ASSERT_EQ(results[0].skipped.size(), 1u);
  EXPECT_NE(results[0].skipped[0].find("the replica of rank 2 at step 4 on rank 0"), std::string::npos)
      << results[0].skipped[0];
}

// A rank's own copy that fails to load (one flipped byte) is dropped, and the same step
// comes from its peer's replica: the state is never changed by the corrupt copy.
TEST(MemoryTier, ACorruptOwnCopyIsReplacedByItsPeersReplicaAtTheSameStep) {
  const ScratchDir dir;
  train_tier_job(dir, kTwoNodesOfTwoRanks, {2, 4}, 2);
  const std::string own = dir.sub(fmt::format("memory/node-0/rank-1-of-4/{}", step_directory_name(4)));
  flip_a_data_byte(own);

  const std::vector<TierRestore> results = restore_tier_job(dir, kTwoNodesOfTwoRanks, 4);
  EXPECT_EQ(results[0].step, 4);
  EXPECT_EQ(results[0].tier, RestoreTier::kPeerReplica);
  EXPECT_EQ(results[0].fetched_ranks, (std::vector<int64_t>{1}));
  ASSERT_EQ(results[0].skipped.size(), 1u);
  EXPECT_NE(results[0].skipped[0].find(own), std::string::npos) << results[0].skipped[0];
}

TEST(MemoryTier, ALostNodeAndItsPeerResumeFromStorage) {
  const ScratchDir dir;
  train_tier_job(dir, kTwoNodesOfTwoRanks, {2, 4}, 2);
  fs::remove_all(dir.sub("memory/node-0"));
  fs::remove_all(dir.sub("memory/node-1"));
  const std::vector<TierRestore> results = restore_tier_job(dir, kTwoNodesOfTwoRanks, 2);
  EXPECT_EQ(results[3].step, 2);
  EXPECT_EQ(results[3].tier, RestoreTier::kStorage);
}

// Node 1's ranks keep their replicas on node 2 (the next node), not on node 0 (the one
// whose replicas node 1 holds); node 1 lost, they fetch them from node 2.
TEST(MemoryTier, OnARingOfThreeNodesALostNodesRanksFetchFromTheNextNode) {
  for (const TierJob& job : {kThreeNodesOfOneRank, kThreeNodesOfTwoRanks}) {
    SCOPED_TRACE(fmt::format("{} ranks, {} a node", job.ranks, job.ranks_per_node));
    const ScratchDir dir;
    train_tier_job(dir, job, {2, 4}, 2);
    for (const int64_t rank : job.ranks_of_node(1)) {
      StateDict replica = empty_memory_tier_state(rank);
      load(replica, replica_dir(dir, job, 2, rank, 4));
      expect_memory_tier_state(replica, rank, 4);
      EXPECT_FALSE(fs::exists(replica_dir(dir, job, 0, rank, 4)));
    }
    fs::remove_all(dir.sub("memory/node-1"));

    for (const TierRestore& result : restore_tier_job(dir, job, 4)) {
      EXPECT_EQ(result.step, 4);
      EXPECT_EQ(result.tier, RestoreTier::kPeerReplica);
      EXPECT_EQ(result.fetched_ranks, job.ranks_of_node(1));
      EXPECT_EQ(result.skipped, std::vector<std::string>{});
    }
  }
}

// Node 1 and node 2, which holds its replicas, are lost: rank 1 has no memory copy
// anywhere, and the job takes storage's step, bit-identical, though node 0 and node 2's
// replica on it hold a newer one.
TEST(MemoryTier, OnARingOfThreeNodesALostNodeAndItsPeerResumeFromStorageAtItsStep) {
  const ScratchDir dir;
  train_tier_job(dir, kThreeNodesOfOneRank, {2, 4, 6}, 4);
  fs::remove_all(dir.sub("memory/node-1"));
  fs::remove_all(dir.sub("memory/node-2"));
  for (const TierRestore& result : restore_tier_job(dir, kThreeNodesOfOneRank, 4)) {
    EXPECT_EQ(result.step, 4);
    EXPECT_EQ(result.tier, RestoreTier::kStorage);
    EXPECT_EQ(result.fetched_ranks, std::vector<int64_t>{});
  }
}

// Node 1 lost, a byte flips in the replicas node 2 holds for node 1's first rank: each
// corrupt copy fails its checksums, is skipped and named, and the ranks agree again
// (memory_tier.h): on the older step, from node 2's other replica (two ranks a node), or,
// with both replicas corrupt, on storage's step (one rank a node).
TEST(MemoryTier, OnARingOfThreeNodesACorruptReplicaOfTheLostNodeIsSkippedAndTheRanksAgreeAgain) {
  struct CorruptCase {
    TierJob job;
    std::vector<int64_t> corrupt_steps;  // newest first, as the restore tries them
    int64_t expected_step;
    RestoreTier expected_tier;
  };
  for (const CorruptCase& test : {CorruptCase{kThreeNodesOfTwoRanks, {6}, 4, RestoreTier::kPeerReplica},
                                  CorruptCase{kThreeNodesOfOneRank, {6, 4}, 2, RestoreTier::kStorage}}) {
    const TierJob& job = test.job;
    SCOPED_TRACE(fmt::format("{} ranks, {} a node", job.ranks, job.ranks_per_node));
    const int64_t lost = job.ranks_of_node(1)[0];
    const int64_t holder = job.ranks_of_node(2)[0];
    const ScratchDir dir;
    train_tier_job(dir, job, {2, 4, 6}, 2);
    fs::remove_all(dir.sub("memory/node-1"));
    for (const int64_t step : test.corrupt_steps) flip_a_data_byte(replica_dir(dir, job, 2, lost, step));

    for (const TierRestore& result : restore_tier_job(dir, job, test.expected_step)) {
      EXPECT_EQ(result.step, test.expected_step);
      EXPECT_EQ(result.tier, test.expected_tier);
      if (test.expected_tier == RestoreTier::kPeerReplica) EXPECT_EQ(result.fetched_ranks, job.ranks_of_node(1));
      ASSERT_EQ(result.skipped.size(), test.corrupt_steps.size());
      for (size_t i = 0; i < test.corrupt_steps.size(); ++i) {
        const int64_t step = test.corrupt_steps[i];
        EXPECT_TRUE(names_replica(result.skipped[i], lost, step, holder, replica_dir(dir, job, 2, lost, step)));
      }
    }
  }
}

TEST(MemoryTier, OptionsAndLayoutsThatCannotWorkAreRefusedByName) {
  const ScratchDir dir;
  EXPECT_THROW(check_memory_tier_options(MemoryTierOptions(dir.path()).keep_last(3)), InvalidArgument);
  EXPECT_THROW(check_memory_tier_options(MemoryTierOptions().save_every(5)), InvalidArgument);
  try {
    MemoryTier tier(MemoryTierOptions(dir.path()).save_every(1), NodeLayout{1, 1});
    ADD_FAILURE() << "node 1 of a job of one rank was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("node 1"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace stowage::dcp::testing
