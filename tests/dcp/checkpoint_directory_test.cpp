// The directory model (checkpoint_directory.h) over real directories: one checkpoint of
// either format, a directory of step-<N> checkpoints whatever its name, a run directory;
// the latest committed checkpoint past a half-written newer one; what is none of these;
// a CheckpointManager that keeps a PyTorch DCP checkpoint and restores its own; and the
// checked byte count of a tensor whose chunks each fit.

#include "build_paths.h"
#include "dcp/format/metadata_codec.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace stowage::dcp {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::state_of;

const std::string kTorchDcpFixture = test_paths::source_dir() + "/tests/interop/fixtures/torch_dcp/one_rank";

// Committed stowage checkpoints of steps 2 and 4 in `directory`, a PyTorch DCP one of
// step 3, and a half-written step 6 (a data file, no metadata).
void fill_with_steps(const std::string& directory) {
  save(state_of({{"w", torch::ones({4})}}), directory + "/" + step_directory_name(2));
  save(state_of({{"w", torch::ones({4})}}), directory + "/" + step_directory_name(4));
  fs::copy(kTorchDcpFixture, directory + "/" + step_directory_name(3));
  fs::create_directories(directory + "/" + step_directory_name(6));
  testing::write_file(directory + "/" + step_directory_name(6) + "/data-0-r0-0.data", "half-written");
}

void expect_invalid_naming(const std::string& path, const std::string& words) {
  try {
    describe_directory(path);
    ADD_FAILURE() << path << " was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'" + path + "'"));
    EXPECT_THAT(e.what(), HasSubstr("a directory of step-<N> checkpoints"));
    EXPECT_THAT(e.what(), HasSubstr(words));
  }
}

TEST(DcpCheckpointDirectory, OneCheckpointOfEitherFormatIsItself) {
  const ScratchDir dir;
  save(state_of({{"w", torch::ones({4})}}), dir.sub("mine"));
  const CheckpointDirectory mine = describe_directory(dir.sub("mine"));
  EXPECT_EQ(mine.kind, DirectoryKind::kCheckpoint);
  EXPECT_EQ(mine.format, CheckpointFormat::kStowage);
  const ReadableCheckpoint read = checkpoint_to_read(mine);
  EXPECT_EQ(read.path, dir.sub("mine"));
  EXPECT_FALSE(read.step.has_value());

  const CheckpointDirectory theirs = describe_directory(kTorchDcpFixture);
  EXPECT_EQ(theirs.kind, DirectoryKind::kCheckpoint);
  EXPECT_EQ(theirs.format, CheckpointFormat::kPyTorchDcp);
  EXPECT_STREQ(format_name(theirs.format), "pytorch-dcp");
}

TEST(DcpCheckpointDirectory, TheLatestCommittedOfADirectoryOfStepsSkipsAHalfWrittenNewerOne) {
  const ScratchDir dir;
  fill_with_steps(dir.sub("saved-models"));
  const CheckpointDirectory held = describe_directory(dir.sub("saved-models"));
  EXPECT_EQ(held.kind, DirectoryKind::kCheckpoints);
  EXPECT_EQ(held.checkpoints, dir.sub("saved-models"));
  ASSERT_EQ(held.listed.size(), 4u);
  EXPECT_EQ(held.listed[1].step, 3);
  EXPECT_TRUE(held.listed[1].committed);
  EXPECT_EQ(held.listed[1].format, CheckpointFormat::kPyTorchDcp);
  EXPECT_FALSE(held.listed[3].committed);
  const ReadableCheckpoint read = checkpoint_to_read(held);
  EXPECT_EQ(read.step, 4);
  EXPECT_EQ(read.path, dir.sub("saved-models") + "/step-00000004");
  EXPECT_EQ(read.format, CheckpointFormat::kStowage);
}

TEST(DcpCheckpointDirectory, ARunDirectoryIsItsCheckpointsFolder) {
  const ScratchDir dir;
  fill_with_steps(dir.sub("run") + "/" + kRunCheckpointsFolder);
  const CheckpointDirectory run = describe_directory(dir.sub("run"));
  EXPECT_EQ(run.kind, DirectoryKind::kRun);
  EXPECT_EQ(run.checkpoints, dir.sub("run") + "/checkpoints");
  EXPECT_EQ(checkpoint_to_read(run).step, 4);
}

TEST(DcpCheckpointDirectory, ARunWithoutACommittedCheckpointHasNoneToRead) {
  const ScratchDir dir;
  fs::create_directories(dir.sub("run") + "/checkpoints/step-00000002");
  const CheckpointDirectory run = describe_directory(dir.sub("run"));
  EXPECT_EQ(run.kind, DirectoryKind::kRun);
  try {
    checkpoint_to_read(run);
    ADD_FAILURE() << "read an uncommitted checkpoint";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the run directory '" + dir.sub("run") + "' has no committed checkpoint"));
    EXPECT_THAT(e.what(), HasSubstr("1 uncommitted"));
  }
  // A folder named checkpoints is a run's before its first save.
  EXPECT_EQ(describe_directory(dir.sub("run") + "/checkpoints").kind, DirectoryKind::kCheckpoints);
}

TEST(DcpCheckpointDirectory, WhatHoldsNoCheckpointIsAnErrorNamingItAndWhatIsTaken) {
  const ScratchDir dir;
  fs::create_directories(dir.sub("empty"));
  fs::create_directories(dir.sub("step-00000009"));
  testing::write_file(dir.sub("file"), "a file");
  expect_invalid_naming(dir.sub("empty"), "holds no checkpoint");
  expect_invalid_naming(dir.sub("file"), "is not a directory but a regular file");
  expect_invalid_naming(dir.sub("absent"), "does not exist");
  expect_invalid_naming(dir.sub("step-00000009"), "it looks like an uncommitted checkpoint");
}

TEST(DcpCheckpointDirectory, AManagerKeepsAPyTorchDcpCheckpointAndRestoresItsOwn) {
  const ScratchDir dir;
  save(state_of({{"w", torch::full({4}, 2.0)}}), dir.sub("run") + "/step-00000002");
  fs::copy(kTorchDcpFixture, dir.sub("run") + "/step-00000003");
  CheckpointManager manager(dir.sub("run"));  // removes what is uncommitted
  EXPECT_EQ(list_checkpoints(dir.sub("run")).size(), 2u);
  EXPECT_EQ(manager.latest()->step, 3);
  StateDict state = state_of({{"w", torch::zeros({4})}});
  EXPECT_EQ(manager.restore(state), 2);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({4}, 2.0)));
}

TEST(DcpCheckpointDirectory, ATensorWhoseBytesOverflowIsAnErrorNamingIt) {
  EntryMetadata entry;
  entry.fqn = "w";
  entry.path = {std::string("w")};
  entry.kind = EntryKind::kTensor;
  entry.dtype = c10::kFloat;
  entry.shape = {int64_t(1) << 40, int64_t(1) << 40};
  EXPECT_THROW(tensor_bytes(entry), Error);

  // Version 1 kept no block checksums: chunks of 2^61 bytes each pass its checks, and the
  // tensor they tile holds 2^64.
  Metadata metadata;
  entry.shape = {int64_t(1) << 31, int64_t(1) << 31};
  entry.chunks.clear();
  for (int64_t part = 0; part < 8; ++part) {
    TensorChunk chunk;
    chunk.box = ChunkBox{{part << 28, 0}, {int64_t(1) << 28, int64_t(1) << 31}};
    chunk.location.file = "part-" + std::to_string(part);
    chunk.location.length = int64_t(1) << 61;
    entry.chunks.push_back(chunk);
  }
  metadata.entries.push_back(entry);
  const Metadata read = decode_metadata(detail::encode_object_layout(metadata, 1), "huge/.metadata.json");
  try {
    tensor_bytes(read);
    ADD_FAILURE() << "counted the bytes of 2^62 floats";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint entry 'w'"));
    EXPECT_THAT(e.what(), HasSubstr("overflow"));
  }
}

}  // namespace
}  // namespace stowage::dcp
