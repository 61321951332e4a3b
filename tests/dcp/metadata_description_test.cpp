// describe_metadata: the one place a checkpoint's chunks become JSON for people and tools
// (`stowage ckpt inspect --json` prints it).

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace stowage::dcp {
namespace {

using nlohmann::json;

// A tensor of shape [4, 3] saved as two row halves by ranks 0 and 1, and one value.
Metadata two_rank_metadata() {
  Metadata metadata;
  metadata.save_id = "save-7";
  metadata.world_size = 2;
  EntryMetadata weight;
  weight.fqn = "model.weight";
  weight.kind = EntryKind::kTensor;
  weight.dtype = c10::ScalarType::Float;
  weight.shape = {4, 3};
  weight.chunks.push_back({{{0, 0}, {2, 3}}, {"save-7.rank0.bin", 0, 24, 0x0123456789abcdefULL, {}}, 0});
  weight.chunks.push_back({{{2, 0}, {2, 3}}, {"save-7.rank1.bin", 64, 24, 0xfedcba9876543210ULL, {}}, 1});
  EntryMetadata step;
  step.fqn = "progress.step";
  step.kind = EntryKind::kValue;
  step.value = c10::IValue(int64_t(12));
  metadata.entries = {weight, step};
  metadata.index();
  return metadata;
}

TEST(DescribeMetadata, ListsEachChunkWithItsBoxWriterByteRangeAndChecksum) {
  const json described = json::parse(describe_metadata(two_rank_metadata(), /*checksummed=*/true));
  EXPECT_EQ(described["save_id"], "save-7");
  EXPECT_EQ(described["ranks"], 2);
  EXPECT_EQ(described["version"], kFormatVersion);
  ASSERT_EQ(described["entries"].size(), 2u);
  const json& weight = described["entries"][0];
  EXPECT_EQ(weight["key"], "model.weight");
  EXPECT_EQ(weight["dtype"], "Float");
  EXPECT_EQ(weight["shape"], json({4, 3}));
  EXPECT_EQ(weight["bytes"], 48);
  ASSERT_EQ(weight["chunks"].size(), 2u);
  const json& second = weight["chunks"][1];
  EXPECT_EQ(second["offsets"], json({2, 0}));
  EXPECT_EQ(second["sizes"], json({2, 3}));
  EXPECT_EQ(second["rank"], 1);
  EXPECT_EQ(second["file"], "save-7.rank1.bin");
  EXPECT_EQ(second["offset"], 64);
  EXPECT_EQ(second["length"], 24);
  EXPECT_EQ(second["checksum"], "fedcba9876543210");
  EXPECT_EQ(weight["chunks"][0]["checksum"], "0123456789abcdef");
  const json& step = described["entries"][1];
  EXPECT_EQ(step["key"], "progress.step");
  EXPECT_EQ(step["value"], "12");
  EXPECT_FALSE(step.contains("chunks"));
}

TEST(DescribeMetadata, ChecksumsOfAFormatThatKeepsNoneAreDashes) {
  const json described = json::parse(describe_metadata(two_rank_metadata(), /*checksummed=*/false));
  for (const json& chunk : described["entries"][0]["chunks"]) EXPECT_EQ(chunk["checksum"], "-");
}

TEST(DescribeMetadata, ATensorWhoseByteCountOverflowsIsAnErrorNamingIt) {
  Metadata metadata = two_rank_metadata();
  metadata.entries[0].shape = {int64_t(1) << 40, int64_t(1) << 40};
  try {
    describe_metadata(metadata, true);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("model.weight"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace stowage::dcp
