// What the format and the commit protocol promise beyond PyTorch's DCP: atomic
// overwrite, clean failure, verified data, safe metadata, and loads that either
// succeed or change nothing.

#include "dcp/test_util.h"

#include <stowage/error.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

StateDict generation(float value, int64_t count = 4, int64_t numel = 256) {
  StateDict state;
  for (int64_t i = 0; i < count; ++i) state.insert("t" + std::to_string(i), torch::full({numel}, value));
  state.insert("generation", static_cast<double>(value));
  return state;
}

// Expects `fn` to throw stowage::Error whose message holds every one of `parts`.
template <typename Fn>
void expect_error_naming(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
  }
}

// The file holding `key`'s first chunk, and the chunk's byte range.
const StorageLocation& location_of(const Metadata& metadata, const std::string& key) {
  return metadata.find(key)->chunks.at(0).location;
}

TEST(DcpSafety, OverwriteReplacesTheCheckpointAndItsFiles) {
  const ScratchDir dir;
  save(generation(1), dir.path());
  const std::vector<std::string> first_files = testing::data_files(dir.path());
  const Metadata second = save(generation(2), dir.path());
  const std::vector<std::string> files = testing::list_files(dir.path());
  // Only the new checkpoint remains: its data files and the metadata.
  std::vector<std::string> expected = second.files();
  expected.push_back(kMetadataFileName);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(files, expected);
  for (const std::string& old : first_files) EXPECT_EQ(std::count(files.begin(), files.end(), old), 0);
  StateDict target = generation(0);
  load(target, dir.path());
  EXPECT_EQ(target.at("generation").toDouble(), 2.0);
  EXPECT_TRUE(torch::equal(target.at("t3").toTensor(), torch::full({256}, 2.0f)));
}

TEST(DcpSafety, AReaderKeepsTheCheckpointItOpenedAcrossAnOverwrite) {
  const ScratchDir dir;
  save(generation(1), dir.path());
  FileSystemReader reader(dir.path());
  const Metadata old = reader.read_metadata();
  save(generation(2), dir.path());  // deletes the old data files
  const EntryMetadata* entry = old.find("t0");
  std::vector<ChunkRead> reads{ChunkRead{entry, &entry->chunks[0], at::empty({1024}, at::kByte)}};
  reader.read_data(reads);
  EXPECT_TRUE(torch::equal(reads[0].buffer.view(at::kFloat), torch::full({256}, 1.0f)));
}

TEST(DcpSafety, ConcurrentReadersSeeOneWholeCheckpoint) {
  const ScratchDir dir;
  save(generation(0), dir.path());
  std::atomic<bool> done{false};
  std::atomic<int> loads{0};
  std::thread reader([&] {
    while (!done.load()) {
      StateDict target = generation(-1);
      load(target, dir.path());
      const double seen = target.at("generation").toDouble();
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(torch::equal(target.at("t" + std::to_string(i)).toTensor(), torch::full({256}, float(seen))))
            << "a mixture of checkpoints";
      }
      ++loads;
    }
  });
  FileSystemWriter writer(dir.path(), FileSystemWriterOptions().sync_files(false));
  for (int g = 1; g <= 30; ++g) save(generation(static_cast<float>(g)), writer);
  done = true;
  reader.join();
  EXPECT_GT(loads.load(), 0);
}

// Fails after writing `fail_after` items.
class FailingWriter : public FileSystemWriter {
 public:
  FailingWriter(const std::string& path, int fail_after, FileSystemWriterOptions options = {})
      : FileSystemWriter(path, options), fail_after_(fail_after) {}

 protected:
  void on_item_written(const WriteResult&) override {
    if (++written_ > fail_after_) throw Error("injected write failure");
  }

 private:
  int fail_after_;
  std::atomic<int> written_{0};
};

TEST(DcpSafety, AFailedSaveLeavesThePreviousCheckpointAndNoFiles) {
  const ScratchDir dir;
  save(generation(1), dir.path());
  const std::vector<std::string> before = testing::list_files(dir.path());
  for (const bool single_file : {true, false}) {
    FailingWriter writer(dir.path(), 2, FileSystemWriterOptions().single_file_per_rank(single_file).thread_count(2));
    EXPECT_THROW(save(generation(2), writer), Error);
    EXPECT_EQ(testing::list_files(dir.path()), before);
  }
  StateDict target = generation(0);
  load(target, dir.path());
  EXPECT_EQ(target.at("generation").toDouble(), 1.0);
}

TEST(DcpSafety, AFullDiskFailsTheSaveCleanly) {
  const ScratchDir dir;
  save(generation(1), dir.path());
  const std::vector<std::string> before = testing::list_files(dir.path());
  // A file-size limit makes write() fail with EFBIG part-way, like a full disk.
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 100 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  try {
    save(generation(2, 4, 16 * 1024), dir.path());  // 256 KiB of tensors
    ADD_FAILURE() << "expected the save to fail";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), EFBIG) << e.what();
    EXPECT_EQ(e.operation(), "write") << e.what();
    EXPECT_EQ(std::filesystem::path(e.path()).filename().string().rfind("data-", 0), 0u) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(testing::list_files(dir.path()), before);
  StateDict target = generation(0);
  load(target, dir.path());
  EXPECT_EQ(target.at("generation").toDouble(), 1.0);
}

TEST(DcpSafety, OverwriteOffRefusesAnExistingCheckpoint) {
  const ScratchDir dir;
  save(generation(1), dir.path());
  FileSystemWriter writer(dir.path(), FileSystemWriterOptions().overwrite(false));
  EXPECT_THROW(save(generation(2), writer), InvalidArgument);
  StateDict target = generation(0);
  load(target, dir.path());
  EXPECT_EQ(target.at("generation").toDouble(), 1.0);
}

// A checkpoint of two tensors, and a target whose values must survive a failed load.
struct Damaged {
  ScratchDir dir;
  Metadata metadata;
  StateDict target;
  Damaged() {
    StateDict state;
    state.insert("first", torch::full({1000}, 1.0f));
    state.insert("second.weight", torch::full({1000}, 2.0f));
    state.insert("count", int64_t(5));
    metadata = save(state, dir.path());
    target.insert("first", torch::full({1000}, -1.0f));
    target.insert("second.weight", torch::full({1000}, -1.0f));
    target.insert("count", int64_t(-1));
  }
  std::string file_of(const std::string& key) const { return dir.sub(location_of(metadata, key).file); }
  void expect_target_untouched() const {
    EXPECT_TRUE(torch::equal(target.at("first").toTensor(), torch::full({1000}, -1.0f)));
    EXPECT_TRUE(torch::equal(target.at("second.weight").toTensor(), torch::full({1000}, -1.0f)));
    EXPECT_EQ(target.at("count").toInt(), -1);
  }
};

TEST(DcpSafety, AFlippedByteFailsTheLoadNamingKeyAndFile) {
  Damaged d;
  const StorageLocation& where = location_of(d.metadata, "second.weight");
  std::string bytes = testing::read_file(d.file_of("second.weight"));
  bytes[where.offset + where.length / 2] ^= 0x10;
  testing::write_file(d.file_of("second.weight"), bytes);
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"second.weight", where.file, "corrupt"});
  d.expect_target_untouched();
}

TEST(DcpSafety, ATruncatedFileFailsTheLoadNamingKeyAndFile) {
  Damaged d;
  const std::string path = d.file_of("first");
  std::string bytes = testing::read_file(path);
  const StorageLocation& last =
      location_of(d.metadata, "second.weight").offset > location_of(d.metadata, "first").offset
          ? location_of(d.metadata, "second.weight")
          : location_of(d.metadata, "first");
  ASSERT_EQ(::truncate(path.c_str(), last.offset + last.length - 1), 0);
  const std::string key = &last == &location_of(d.metadata, "first") ? "first" : "second.weight";
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {key, last.file, "truncated"});
  d.expect_target_untouched();
}

TEST(DcpSafety, AMissingFileFailsTheLoadNamingKeyAndFile) {
  Damaged d;
  ASSERT_EQ(::unlink(d.file_of("first").c_str()), 0);
  expect_error_naming([&] { load(d.target, d.dir.path()); },
                      {"first", location_of(d.metadata, "first").file, "missing"});
  d.expect_target_untouched();
}

TEST(DcpSafety, ASymlinkedDataFileIsNotFollowed) {
  Damaged d;
  const std::string path = d.file_of("first");
  const std::string elsewhere = d.dir.sub("elsewhere");
  ASSERT_EQ(::rename(path.c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), path.c_str()), 0);
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"first", location_of(d.metadata, "first").file});
  d.expect_target_untouched();
}

TEST(DcpSafety, MetadataIsValidatedBeforeAnythingIsRead) {
  Damaged d;
  const std::string path = testing::metadata_path(d.dir.path());
  const std::string good = testing::read_file(path);
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    testing::write_file(path, text);
  };
  const std::string file = location_of(d.metadata, "first").file;
  with("\"" + file + "\"", "\"../../etc/passwd\"");
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"first", "leave the checkpoint directory"});
  with("\"version\":" + std::to_string(kFormatVersion), "\"version\":99");
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"version 99"});
  with("\"Float\"", "\"Pickle\"");
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"first", "unknown dtype 'Pickle'"});
  testing::write_file(path, good.substr(0, good.size() / 2));
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"not valid JSON"});
  d.expect_target_untouched();
  ::unlink(path.c_str());
  expect_error_naming([&] { load(d.target, d.dir.path()); }, {"holds no checkpoint"});
}

TEST(DcpSafety, MismatchesAreClearErrorsAndPartialLoadIsOptIn) {
  Damaged d;
  StateDict extra = d.target;  // shares the tensors: a failed load must leave them too
  extra.insert("not.saved", torch::zeros({3}));
  try {
    load(extra, d.dir.path());
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'not.saved' is not in the checkpoint"), std::string::npos) << e.what();
  }
  d.expect_target_untouched();

  StateDict wrong_shape;
  wrong_shape.insert("first", torch::zeros({999}));
  expect_error_naming([&] { load(wrong_shape, d.dir.path()); }, {"'first'", "Float [999]", "Float [1000]"});
  StateDict wrong_dtype;
  wrong_dtype.insert("first", torch::zeros({1000}, torch::kFloat64));
  expect_error_naming([&] { load(wrong_dtype, d.dir.path()); }, {"'first'", "Double [1000]", "Float [1000]"});
  StateDict wrong_kind;
  wrong_kind.insert("count", torch::zeros({1}));
  expect_error_naming([&] { load(wrong_kind, d.dir.path()); }, {"'count'", "tensor in the state dict"});

  load(extra, d.dir.path(), LoadOptions().allow_partial_load(true));
  EXPECT_TRUE(torch::equal(extra.at("first").toTensor(), torch::full({1000}, 1.0f)));
  EXPECT_TRUE(torch::equal(extra.at("not.saved").toTensor(), torch::zeros({3})));
  EXPECT_EQ(extra.at("count").toInt(), 5);
}

}  // namespace
}  // namespace stowage::dcp
