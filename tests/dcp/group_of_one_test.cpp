// The distributed save and load steps with a group of one: their errors travel as
// DistributedCheckpointError, and a failed one changes nothing.

#include "dcp/test_util.h"

#include <stowage/error.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

TEST(DcpGroupOfOne, ErrorsOfAGroupSaveOrLoadAreDistributedCheckpointErrorsAndChangeNothing) {
  const ScratchDir dir;
  const dist::ProcessGroup group = dist::init_process_group(
      "127.0.0.1", testing::free_port(), 0, 1, dist::ProcessGroupOptions().timeout(std::chrono::seconds(20)));
  StateDict state;
  state.insert("w", torch::ones({4}));
  save(state, dir.path(), group);

  StateDict bad;
  bad.insert("w", torch::Tensor());
  try {
    save(bad, dir.path(), group);
    ADD_FAILURE() << "saved an undefined tensor";
  } catch (const DistributedCheckpointError& e) {
    EXPECT_EQ(e.step(), "plan");
    ASSERT_EQ(e.failures().count(0), 1u);
    EXPECT_EQ(e.failures().at(0).kind, RankFailure::Kind::kInvalidArgument) << e.what();
    EXPECT_NE(e.failures().at(0).message.find("'w'"), std::string::npos) << e.what();
  }
  StateDict target;
  target.insert("w", torch::zeros({5}));
  EXPECT_THROW(load(target, dir.path(), {}, group), DistributedCheckpointError);
  EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::zeros({5})));
  target.insert_or_assign("w", torch::zeros({4}));
  load(target, dir.path(), {}, group);  // the first save is still the checkpoint
  EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::ones({4})));

  // async_save on a group: the error reaches the futures, not the caller.
  FileSystemWriter writer(dir.path());
  const AsyncSaveResponse response = async_save(bad, writer, nullptr, {}, group);
  EXPECT_THROW(response.upload_completion.get(), DistributedCheckpointError);
  const AsyncSaveResponse good = async_save(state, writer, nullptr, {}, group);
  EXPECT_EQ(good.upload_completion.get().world_size, 1);
}

// A rank's failure reaches the group as its error's kind and its class's fields.
TEST(DcpGroupOfOne, ARanksFailureCarriesItsErrorsKindAndFields) {
  const ScratchDir dir;
  const dist::ProcessGroup group = dist::init_process_group(
      "127.0.0.1", testing::free_port(), 0, 1, dist::ProcessGroupOptions().timeout(std::chrono::seconds(20)));
  StateDict state;
  state.insert("w", torch::ones({1024}));
  save(state, dir.path(), group);
  // Every data file with one byte flipped in the middle of its payload.
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".data") continue;
    std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(static_cast<std::streamoff>(entry.file_size() / 2));
    const char byte = static_cast<char>(file.get() ^ 0x5a);
    file.seekp(static_cast<std::streamoff>(entry.file_size() / 2));
    file.put(byte);
  }
  StateDict target;
  target.insert("w", torch::zeros({1024}));
  try {
    load(target, dir.path(), {}, group);
    ADD_FAILURE() << "loaded a corrupted checkpoint";
  } catch (const DistributedCheckpointError& e) {
    const RankFailure& failure = e.failures().at(0);
    EXPECT_EQ(failure.kind, ErrorKind::kCorruption) << e.what();
    EXPECT_EQ(failure.entry, "w") << e.what();
    EXPECT_NE(failure.file.find(".data"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stowage::dcp
