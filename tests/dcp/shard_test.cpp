// Sharded tensors and partial reads in one process: a checkpoint's chunks load into
// any box by overlap, reading only the checksum blocks the box touches, each verified;
// version-1 checkpoints (no block checksums) still load.

#include "dcp/format/metadata_codec.h"
#include "dcp/test_util.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

// [512, 1024] floats: 2 MiB, eight checksum blocks of 64 rows each.
torch::Tensor global_tensor() {
  return torch::arange(512 * 1024, torch::kFloat).reshape({512, 1024});
}

StateDict shard_state(const torch::Tensor& local, std::vector<int64_t> offsets) {
  StateDict state;
  state.insert("w", sharded_tensor(local, {512, 1024}, std::move(offsets)));
  return state;
}

TEST(DcpShard, ShardedTensorRejectsABoxOutsideTheGlobalTensor) {
  EXPECT_THROW(sharded_tensor(torch::zeros({4, 4}), {8, 4}, {5, 0}), InvalidArgument);
  EXPECT_THROW(sharded_tensor(torch::zeros({4, 4}), {8, 4, 1}, {0, 0, 0}), InvalidArgument);
  EXPECT_THROW(sharded_tensor(torch::Tensor(), {8}, {0}), InvalidArgument);
  StateDict state;
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(sharded_tensor(torch::zeros({2}), {4}, {0}));
  state.insert("l", list);
  EXPECT_THROW(save(state, ScratchDir().path()), InvalidArgument);
}

TEST(DcpShard, ShardsSavedInOneProcessTileTheTensor) {
  // Two shards of one rank cannot be expressed; one shard alone does not tile.
  const ScratchDir dir;
  const torch::Tensor global = global_tensor();
  try {
    save(shard_state(global.narrow(0, 0, 100).clone(), {0, 0}), dir.path());
    ADD_FAILURE() << "a partial shard was saved as the whole tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST(DcpShard, AShardLoadsByOverlapReadingOnlyItsBlocks) {
  const ScratchDir dir;
  const torch::Tensor global = global_tensor();
  StateDict whole;
  whole.insert("w", global);
  const Metadata metadata = save(whole, dir.path());
  ASSERT_EQ(metadata.find("w")->chunks.at(0).location.block_checksums.size(), 8u);

  // Rows 100..199: touches blocks 1..3 (64 rows each), not the other five.
  torch::Tensor rows = torch::zeros({100, 1024});
  StateDict target = shard_state(rows, {100, 0});
  FileSystemReader reader(dir.path());
  load(target, reader);
  EXPECT_TRUE(torch::equal(rows, global.narrow(0, 100, 100)));
  EXPECT_EQ(reader.bytes_read(), 3 * kChecksumBlockBytes);

  // A column box spans every row: all blocks, each verified, nothing beyond the chunk.
  torch::Tensor cols = torch::zeros({512, 3});
  target = shard_state(cols, {0, 1021});
  load(target, reader);
  EXPECT_TRUE(torch::equal(cols, global.narrow(1, 1021, 3)));
  EXPECT_EQ(reader.bytes_read(), 8 * kChecksumBlockBytes);

  // An inner box.
  torch::Tensor inner = torch::zeros({7, 5});
  target = shard_state(inner, {300, 17});
  load(target, reader);
  EXPECT_TRUE(torch::equal(inner, global.narrow(0, 300, 7).narrow(1, 17, 5)));
  EXPECT_EQ(reader.bytes_read(), kChecksumBlockBytes);
}

TEST(DcpShard, ACorruptBlockFailsAPartialLoadAndChangesNothing) {
  const ScratchDir dir;
  StateDict whole;
  whole.insert("w", global_tensor());
  const Metadata metadata = save(whole, dir.path());
  const StorageLocation& location = metadata.find("w")->chunks.at(0).location;
  const std::string path = dir.sub(location.file);
  std::string bytes = testing::read_file(path);
  bytes[location.offset + 2 * kChecksumBlockBytes + 10] ^= 0x40;  // in block 2
  testing::write_file(path, bytes);

  // Rows 0..63 are block 0: still verified and loaded.
  torch::Tensor clean = torch::zeros({64, 1024});
  StateDict target = shard_state(clean, {0, 0});
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(clean, global_tensor().narrow(0, 0, 64)));

  torch::Tensor rows = torch::full({100, 1024}, -1.0f);
  target = shard_state(rows, {100, 0});
  try {
    load(target, dir.path());
    ADD_FAILURE() << "a corrupt block was loaded";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.entry(), "w") << e.what();
    EXPECT_EQ(e.file(), path) << e.what();
    EXPECT_EQ(e.offset(), location.offset + 2 * kChecksumBlockBytes) << e.what();  // block 2's first byte
  }
  EXPECT_TRUE(torch::equal(rows, torch::full({100, 1024}, -1.0f)));
}

TEST(DcpShard, VersionOneCheckpointsStillLoadWholeOrInPart) {
  const ScratchDir dir;
  StateDict whole;
  whole.insert("w", global_tensor());
  save(whole, dir.path());
  // Rewrite the metadata as version 1 wrote it: an object per entry and chunk, no block
  // checksums, no metadata checksum.
  const Metadata saved = FileSystemReader(dir.path()).read_metadata();
  nlohmann::json metadata = nlohmann::json::parse(detail::encode_object_layout(saved, 1));
  testing::write_file(testing::metadata_path(dir.path()), metadata.dump());

  FileSystemReader reader(dir.path());
  torch::Tensor rows = torch::zeros({100, 1024});
  StateDict target = shard_state(rows, {100, 0});
  load(target, reader);
  EXPECT_TRUE(torch::equal(rows, global_tensor().narrow(0, 100, 100)));
  EXPECT_EQ(reader.bytes_read(), 512 * 1024 * 4);  // the whole chunk: its one checksum
  StateDict full;
  full.insert("w", torch::zeros({512, 1024}));
  load(full, reader);
  EXPECT_TRUE(torch::equal(full.at("w").toTensor(), global_tensor()));

  // A version-2 chunk without its block checksums is malformed.
  metadata["version"] = 2;
  metadata["checksum_block_bytes"] = kChecksumBlockBytes;
  testing::write_file(testing::metadata_path(dir.path()), metadata.dump());
  EXPECT_THROW(load(full, dir.path()), Error);
}

TEST(DcpShard, AShardOfADifferentGlobalShapeIsAClearError) {
  const ScratchDir dir;
  StateDict whole;
  whole.insert("w", global_tensor());
  save(whole, dir.path());
  StateDict target;
  target.insert("w", sharded_tensor(torch::zeros({4, 4}), {512, 1000}, {0, 0}));
  try {
    load(target, dir.path());
    ADD_FAILURE() << "loaded a shard of another shape";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST(DcpPlanner, RandomShardingsWithEmptyPiecesAnywherePlanOnceAndTile) {
  // Every rank holds one piece of each tensor, cut along one dimension at random points
  // (repeats and ends make empty pieces), an empty piece at a random offset: the global
  // plan writes every non-empty piece once and the recorded chunks tile the tensor.
  std::mt19937 random(13);
  const auto draw = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t world = draw(2, 6);
    std::vector<int64_t> shape;
    for (int64_t d = draw(1, 3); d > 0; --d) shape.push_back(draw(0, 5));
    const int64_t dim = draw(0, static_cast<int64_t>(shape.size()) - 1);
    std::vector<int64_t> cuts{0};
    for (int64_t r = 1; r < world; ++r) cuts.push_back(draw(0, 2) == 0 ? cuts.front() : draw(0, shape[dim]));
    cuts.push_back(shape[dim]);
    std::sort(cuts.begin(), cuts.end());
    std::vector<SavePlan> plans;
    int64_t non_empty = 0;
    for (int64_t rank = 0; rank < world; ++rank) {
      std::vector<int64_t> sizes = shape;
      sizes[dim] = cuts[rank + 1] - cuts[rank];
      std::vector<int64_t> offsets(shape.size(), 0);
      offsets[dim] = sizes[dim] == 0 ? draw(0, shape[dim]) : cuts[rank];
      StateDict state;
      state.insert("w", sharded_tensor(torch::zeros(sizes), shape, offsets));
      plans.push_back(create_local_save_plan(SaveableState(state), rank));
      non_empty += torch::zeros(sizes).numel() != 0 ? 1 : 0;
    }
    const std::string where = fmt::format("trial {}: shape [{}] cut along {} at [{}]", trial, fmt::join(shape, ", "),
                                          dim, fmt::join(cuts, ", "));
    GlobalSavePlan global;
    ASSERT_NO_THROW(global = create_global_save_plan(plans)) << where;
    std::vector<std::vector<WriteResult>> results(world);
    int64_t written = 0;
    for (const SavePlan& plan : global.plans) {
      for (const WriteItem& item : plan.items) {
        results[plan.rank].push_back(WriteResult{item.fqn, item.box, StorageLocation{}, plan.rank});
        if (item.nbytes != 0) ++written;
      }
    }
    EXPECT_EQ(written, non_empty) << where;
    ASSERT_NO_THROW(record_write_results(global.metadata, results)) << where;
  }
}

}  // namespace
}  // namespace stowage::dcp
