// The memory tier's pages and its replication in the background (issue 40): a dropped
// checkpoint's data file is written over by the next save (same inode, exact size,
// loads bit-exact), and a save returns before its replication, which the next save or
// finish_replication() reports, its own copy kept until the replica is committed.

#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/memory_tier.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace stowage::dcp::testing {
namespace {
namespace fs = std::filesystem;

StateDict pages_state(int64_t numel, int64_t step) {
  return state_of({{"weights", at::arange(numel, at::kFloat).add_(static_cast<double>(step))}});
}

// The one data file of a memory checkpoint.
std::string data_file_of(const std::string& checkpoint) {
  const std::vector<std::string> files = data_files(checkpoint);
  EXPECT_EQ(files.size(), 1u) << checkpoint;
  return files.empty() ? "" : (fs::path(checkpoint) / files.front()).string();
}

void expect_loads(const std::string& checkpoint, int64_t numel, int64_t step) {
  StateDict loaded = state_of({{"weights", at::zeros({numel}, at::kFloat)}});
  load(loaded, checkpoint);
  EXPECT_TRUE(loaded.at("weights").toTensor().equal(pages_state(numel, step).at("weights").toTensor())) << checkpoint;
}

std::vector<int64_t> steps_in(const std::string& directory) {
  std::vector<int64_t> steps;
  for (const ManagedCheckpoint& checkpoint : list_checkpoints(directory)) steps.push_back(checkpoint.step);
  return steps;
}

TEST(MemoryTierPages, ADroppedCheckpointsDataFileIsWrittenOverByTheNextSave) {
  const ScratchDir dir;
  MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1).keep_last(1), NodeLayout{});
  ASSERT_EQ(tier.save(1, pages_state(8192, 1)).error, "");
  const ino_t first = inode_of(data_file_of(tier.own_path(1)));
  ASSERT_EQ(tier.save(2, pages_state(8192, 2)).error, "");
  EXPECT_FALSE(fs::exists(tier.own_path(1)));  // dropped: its file is a spare now
  EXPECT_NE(inode_of(data_file_of(tier.own_path(2))), first);
  ASSERT_EQ(tier.save(3, pages_state(8192, 3)).error, "");
  EXPECT_EQ(inode_of(data_file_of(tier.own_path(3))), first) << "step 1's pages were not written over";
  expect_loads(tier.own_path(3), 8192, 3);
}

TEST(MemoryTierPages, AFileWrittenOverEndsWhereItsNewBytesEndSmallerOrLarger) {
  const ScratchDir dir;
  MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1).keep_last(1), NodeLayout{});
  // Each save writes over the file of the one two steps before it.
  const std::vector<int64_t> sizes = {8192, 8192, 1024, 1024, 65536};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto step = static_cast<int64_t>(i + 1);
    ASSERT_EQ(tier.save(step, pages_state(sizes[i], step)).error, "");
    EXPECT_EQ(fs::file_size(data_file_of(tier.own_path(step))), static_cast<uintmax_t>(sizes[i] * 4))
        << "step " << step;
    expect_loads(tier.own_path(step), sizes[i], step);
  }
}

TEST(MemoryTierPages, ASaveReturnsBeforeItsReplicationWhichTheNextSaveReports) {
  const ScratchDir dir;
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    const int64_t rank = group.rank();
    MemoryTier tier(MemoryTierOptions(dir.sub("memory")).save_every(1).keep_last(1), NodeLayout{rank, 1}, group);
    const std::string own = fs::path(tier.own_path(1)).parent_path().string();
    const MemorySaveReport first = tier.save(1, pages_state(4096, 10 * rank + 1));
    ASSERT_EQ(first.error, "");
    EXPECT_FALSE(first.previous_replication.has_value());
    const MemorySaveReport second = tier.save(2, pages_state(4096, 10 * rank + 2));
    ASSERT_EQ(second.error, "");
    ASSERT_TRUE(second.previous_replication.has_value());
    EXPECT_EQ(second.previous_replication->step, 1);
    EXPECT_EQ(second.previous_replication->error, "");
    // Step 1 stays until step 2's replica is committed: a lost node's ranks need it.
    EXPECT_EQ(steps_in(own), (std::vector<int64_t>{1, 2})) << "rank " << rank;
    const std::optional<ReplicationReport> last = tier.finish_replication();
    ASSERT_TRUE(last.has_value());
    EXPECT_EQ(last->step, 2);
    EXPECT_EQ(last->error, "");
    EXPECT_FALSE(tier.finish_replication().has_value());  // none in flight
    EXPECT_EQ(steps_in(own), (std::vector<int64_t>{2})) << "rank " << rank;
    group.barrier();  // the peer's replica of this rank is committed too
    expect_loads(tier.replica_path(2), 4096, 10 * *tier.source() + 2);
    EXPECT_FALSE(fs::exists(tier.replica_path(1)));
  });
}

}  // namespace
}  // namespace stowage::dcp::testing
