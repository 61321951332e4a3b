// The memory tier (issue 40): each rank's checkpoints in a node's directory, replicated to
// the same local rank of the next node, and recovery from the newest step every rank can
// get — its own memory, its peer's replica, or storage. Ranks run as threads; "nodes"
// are directories (node-<N>) under one scratch root, and a lost node is one removed.

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

constexpr int64_t kTierRanksPerNode = 2;

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

NodeLayout layout_of_rank(int64_t rank) {
  return NodeLayout{rank / kTierRanksPerNode, kTierRanksPerNode};
}

// Saves `steps` into the memory tier on four ranks (two nodes) and `storage_step` into
// storage.
void train_four_ranks(const ScratchDir& dir, const std::vector<int64_t>& steps, int64_t storage_step) {
  stowage::testing::run_ranks(4, [&](const dist::ProcessGroup& group) {
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1), layout_of_rank(group.rank()), group);
    CheckpointManager storage(dir.sub("storage"), CheckpointManagerOptions(), group);
    for (const int64_t step : steps) {
      const MemorySaveReport report = tier.save(step, memory_tier_state(group.rank(), step));
      ASSERT_EQ(report.error, "");
      if (step == storage_step) storage.save_now(step, memory_tier_state(group.rank(), step));
    }
  });
}

// Restores on four ranks with fresh tiers; every rank's result.
std::vector<TierRestore> restore_four_ranks(const ScratchDir& dir, const std::vector<int64_t>& expected_steps) {
  std::vector<TierRestore> results(4);
  stowage::testing::run_ranks(4, [&](const dist::ProcessGroup& group) {
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1), layout_of_rank(group.rank()), group);
    CheckpointManager storage(dir.sub("storage"), CheckpointManagerOptions(), group);
    StateDict state = empty_memory_tier_state(group.rank());
    results[static_cast<size_t>(group.rank())] = tier.restore(state, storage);
    expect_memory_tier_state(state, group.rank(), expected_steps[static_cast<size_t>(group.rank())]);
  });
  return results;
}

std::string replica_dir(const ScratchDir& dir, int64_t node, int64_t of, int64_t step) {
  return dir.sub(fmt::format("memory/node-{}/replica-of-rank-{}-of-4/{}", node, of, step_directory_name(step)));
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
  train_four_ranks(dir, {2, 4, 6}, 2);
  // Ranks 2 and 3 keep their replicas on node 0 (ranks 0 and 1), and the other way round.
  EXPECT_TRUE(fs::exists(metadata_path(replica_dir(dir, 0, 2, 6))));
  EXPECT_TRUE(fs::exists(metadata_path(replica_dir(dir, 1, 0, 6))));
  fs::remove_all(dir.sub("memory/node-1"));  // node 1 is lost, with its memory

  const std::vector<TierRestore> results = restore_four_ranks(dir, {6, 6, 6, 6});
  for (const TierRestore& result : results) {
    EXPECT_EQ(result.step, 6);
    EXPECT_EQ(result.tier, RestoreTier::kPeerReplica);
    EXPECT_EQ(result.fetched_ranks, (std::vector<int64_t>{2, 3}));
  }
  // The fetched checkpoints are node 1's own again: a second restart needs no peer.
  EXPECT_EQ(restore_four_ranks(dir, {6, 6, 6, 6})[0].tier, RestoreTier::kMemory);
}

TEST(MemoryTier, ACorruptReplicaIsSkippedNeverLoaded) {
  const ScratchDir dir;
  train_four_ranks(dir, {2, 4}, 2);
  // Rank 0 holds rank 2's replica; one byte of step 4's data flips.
  const std::string replica = replica_dir(dir, 0, 2, 4);
  const std::string data = replica + "/" + data_files(replica).at(0);
  std::string bytes = read_file(data);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file(data, bytes);
  fs::remove_all(dir.sub("memory/node-1"));

  // Rank 2 can get step 2 only: the job takes step 2, every rank, from memory and replicas.
  const std::vector<TierRestore> results = restore_four_ranks(dir, {2, 2, 2, 2});
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
  train_four_ranks(dir, {2, 4}, 2);
  const std::string own = dir.sub(fmt::format("memory/node-0/rank-1-of-4/{}", step_directory_name(4)));
  const std::string data = own + "/" + data_files(own).at(0);
  std::string bytes = read_file(data);
  bytes[bytes.size() / 2] ^= 0x40;
  write_file(data, bytes);

  const std::vector<TierRestore> results = restore_four_ranks(dir, {4, 4, 4, 4});
  EXPECT_EQ(results[0].step, 4);
  EXPECT_EQ(results[0].tier, RestoreTier::kPeerReplica);
  EXPECT_EQ(results[0].fetched_ranks, (std::vector<int64_t>{1}));
  ASSERT_EQ(results[0].skipped.size(), 1u);
  EXPECT_NE(results[0].skipped[0].find(own), std::string::npos) << results[0].skipped[0];
}

TEST(MemoryTier, ALostNodeAndItsPeerResumeFromStorage) {
  const ScratchDir dir;
  train_four_ranks(dir, {2, 4}, 2);
  fs::remove_all(dir.sub("memory/node-0"));
  fs::remove_all(dir.sub("memory/node-1"));
  const std::vector<TierRestore> results = restore_four_ranks(dir, {2, 2, 2, 2});
  EXPECT_EQ(results[3].step, 2);
  EXPECT_EQ(results[3].tier, RestoreTier::kStorage);
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
