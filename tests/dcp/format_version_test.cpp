// Format versions: checkpoints written by older builds (committed fixtures of versions 1
// and 2 in tests/dcp/fixtures/) still load and are still validated; version 3's table
// layout keeps the metadata small for many small entries.

#include "build_paths.h"
#include "dcp/test_util.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

std::string fixture(int version) {
  return test_paths::source_dir() + "/tests/dcp/fixtures/version" + std::to_string(version);
}

// What fuzz/make_seeds.cpp saved as its second seed, the fixtures' content: a state to
// load it into, every value different from the saved one.
StateDict fixture_target() {
  StateDict opt;
  opt.insert("bias", torch::zeros({2}, torch::kDouble));
  opt.insert("mask", torch::ones({3}, torch::kBool));
  opt.insert("lr", 0.0);
  opt.insert("betas", c10::List<double>({0.0, 0.0}));
  opt.insert("name", std::string("none"));
  opt.insert("none", c10::IValue());
  StateDict state;
  state.insert("opt", c10::IValue(opt));
  state.insert("e", torch::empty({0, 2}, torch::kHalf));
  return state;
}

void expect_fixture_values(const StateDict& state) {
  const StateDict opt(state.at("opt").toGenericDict());
  EXPECT_TRUE(torch::equal(opt.at("bias").toTensor(), torch::ones({2}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(opt.at("mask").toTensor(), torch::zeros({3}, torch::kBool)));
  EXPECT_EQ(opt.at("lr").toDouble(), 0.5);
  EXPECT_EQ(opt.at("betas").toDoubleList().vec(), (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(opt.at("name").toStringRef(), "adam");
  EXPECT_TRUE(opt.at("none").isNone());
  EXPECT_EQ(state.at("e").toTensor().sizes(), (std::vector<int64_t>{0, 2}));
}

TEST(DcpFormatVersion, CommittedCheckpointsOfVersionsOneAndTwoLoad) {
  for (int version : {1, 2}) {
    SCOPED_TRACE(version);
    const Metadata metadata = FileSystemReader(fixture(version)).read_metadata();
    EXPECT_EQ(metadata.version, version);
    StateDict state = fixture_target();
    load(state, fixture(version));
    expect_fixture_values(state);
  }
}

TEST(DcpFormatVersion, OlderVersionsAreStillValidated) {
  const ScratchDir dir;
  const std::string copy = dir.sub("v2");
  std::filesystem::copy(fixture(2), copy);
  const std::string good = testing::read_file(testing::metadata_path(copy));
  const auto expect_rejected = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string text = good;
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    testing::write_file(testing::metadata_path(copy), text);
    StateDict state = fixture_target();
    try {
      load(state, copy);
      ADD_FAILURE() << from << " -> " << to << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(StateDict(state.at("opt").toGenericDict()).at("bias").toTensor(),
                             torch::zeros({2}, torch::kDouble)));
  };
  expect_rejected("\"length\": 16", "\"length\": 4096", "cannot be 4096 bytes");
  expect_rejected("\"file\": \"a.data\"", "\"file\": \"../a.data\"", "would leave the checkpoint directory");
  expect_rejected("0.999", "0.5", "checksum");
}

TEST(DcpFormatVersion, VersionThreeMetadataIsCompactForManySmallEntries) {
  // 2,000 tensors of 16 floats with dotted names, as a model's parameters are: version 2
  // took about 390 bytes of metadata each.
  StateDict state;
  for (int i = 0; i < 2000; ++i) state.insert(fmt::format("layers.{}.weight", i), torch::full({16}, float(i)));
  const ScratchDir dir;
  save(state, dir.path());
  const auto bytes = std::filesystem::file_size(testing::metadata_path(dir.path()));
  EXPECT_LT(bytes / 2000, 100u) << bytes << " bytes";
  StateDict target;
  for (int i = 0; i < 2000; ++i) target.insert(fmt::format("layers.{}.weight", i), torch::zeros({16}));
  load(target, dir.path());
  for (int i = 0; i < 2000; i += 199) {
    EXPECT_TRUE(torch::equal(target.at(fmt::format("layers.{}.weight", i)).toTensor(), torch::full({16}, float(i))));
  }
}

TEST(DcpFormatVersion, VersionThreeKeepsExactPathsAndDerivesChunkLengths) {
  // Keys holding dots and list indices need the path itself; lengths come from the boxes.
  StateDict state;
  state.insert("a.b", torch::ones({2}));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::full({3}, 2.0f));
  state.insert("list", list);
  state.insert("s", sharded_tensor(torch::full({2, 4}, 3.0f), {2, 4}, {0, 0}));
  const ScratchDir dir;
  save(state, dir.path());
  const Metadata metadata = FileSystemReader(dir.path()).read_metadata();
  EXPECT_TRUE(metadata.find("a.b")->path == (ObjectPath{std::string("a.b")}));
  EXPECT_TRUE(metadata.find("list.0")->path == (ObjectPath{std::string("list"), int64_t(0)}));
  EXPECT_EQ(metadata.find("s")->chunks.at(0).location.length, 2 * 4 * 4);
}

TEST(DcpFormatVersion, VersionThreeTablesAreValidatedNamingTheEntry) {
  const ScratchDir dir;
  StateDict state;
  state.insert("w", torch::ones({4}));
  save(state, dir.path());
  const std::string path = testing::metadata_path(dir.path());
  const std::string good = testing::read_file(path);
  for (const auto& [from, to, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"[[0,0,\"", "[[5,0,\"", "file index 5 is not below the 1 files"},
           {"\"t\",\"w\"", "\"x\",\"w\"", "unknown kind 'x'"},
           {",0,[]]]]", ",0]]]", "a chunk must be a list of 5 or 7 fields"},
           {",0,[]]]]", ",0,[\"0123456789abcdef\"]]]]", "must list 0 block checksums"},
           {",0,[]]]]", ",0,[],[0],[8]]]]", "leaves the tensor"},
           {"\"files\":[\"", "\"files\":[\"../", "would leave the checkpoint directory"}}) {
    SCOPED_TRACE(to);
    std::string text = good;
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    testing::write_file(path, text);
    StateDict target;
    target.insert("w", torch::zeros({4}));
    try {
      load(target, dir.path());
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(torch::equal(target.at("w").toTensor(), torch::zeros({4})));
  }
}

TEST(DcpFormatVersion, TheFuzzSeedsAreCheckpointsOfTheCurrentFormat) {
  // fuzz/make_seeds.cpp writes seed-<i>.json; the fixtures' metadata, committed beside
  // them, keep the older readers fuzzed too.
  int seeds = 0;
  for (const auto& file : std::filesystem::directory_iterator(test_paths::source_dir() + "/fuzz/corpus/metadata")) {
    const std::string name = file.path().filename().string();
    if (name.rfind("seed-", 0) != 0) continue;
    SCOPED_TRACE(name);
    EXPECT_EQ(decode_metadata(testing::read_file(file.path().string()), name).version, kFormatVersion);
    ++seeds;
  }
  EXPECT_GE(seeds, 3);
}

}  // namespace
}  // namespace stowage::dcp
