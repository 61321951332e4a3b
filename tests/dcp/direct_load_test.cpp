// load reads straight into the caller's tensors once every read is verified, through
// read-only mappings of the data files: these tests cover that path and its fallbacks,
// and the writer's copies ahead of its writes (per_thread_copy_ahead).

#include "dcp/storage/copy_ahead.h"
#include "dcp/storage/mapped_file.h"
#include "dcp/test_util.h"

#include <stowage/error.h>

#include <gtest/gtest.h>

#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

StateDict two_tensors(float a, float b) {
  StateDict state;
  state.insert("a", torch::full({1 << 16}, a));
  state.insert("b", torch::full({1 << 16}, b));
  return state;
}

// Reads "a" through `reader` with verify_data() first, as load does.
std::vector<ChunkRead> verified_read_of_a(FileSystemReader& reader, const Metadata& metadata, at::Tensor buffer) {
  const EntryMetadata* entry = metadata.find("a");
  std::vector<ChunkRead> reads{ChunkRead{entry, &entry->chunks[0], std::move(buffer)}};
  EXPECT_TRUE(reader.verify_data(reads));
  EXPECT_TRUE(reads[0].verified);
  return reads;
}

TEST(DcpDirectLoad, GuardedReadsOfATruncatedMappingFailInsteadOfCrashing) {
  const ScratchDir dir;
  const std::string path = dir.sub("file");
  testing::write_file(path, std::string(1 << 20, 'x'));
  const detail::File file = detail::File::open_for_reading(path);
  const detail::MappedFile mapping(file, 1 << 20);
  std::vector<char> out(1 << 20);
  ASSERT_TRUE(detail::guarded_copy(out.data(), mapping.data(), out.size()));
  EXPECT_EQ(out[12345], 'x');
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  EXPECT_FALSE(detail::guarded_copy(out.data(), mapping.data(), out.size()));
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  EXPECT_FALSE(detail::guarded_hash_update(state, mapping.data(), 1 << 20));
  XXH3_freeState(state);
  // The pages still in the file read as before, from the same thread.
  ASSERT_TRUE(detail::guarded_copy(out.data(), mapping.data(), 4096));
  EXPECT_EQ(out[4095], 'x');
}

TEST(DcpDirectLoad, MappingAFileShorterThanItWasFailsNamingIt) {
  const ScratchDir dir;
  const std::string path = dir.sub("file");
  testing::write_file(path, std::string(100, 'x'));
  const detail::File file = detail::File::open_for_reading(path);
  try {
    detail::MappedFile mapping(file, 200);
    FAIL() << "mapped 200 bytes of a 100-byte file";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.file(), path) << e.what();
    EXPECT_EQ(e.offset(), 100) << e.what();  // where the file ends
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST(DcpDirectLoad, AFileTruncatedBetweenVerifyingAndCopyingFailsTheCopy) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  FileSystemReader reader(dir.path());
  const Metadata metadata = reader.read_metadata();
  at::Tensor destination = torch::zeros({1 << 16});
  std::vector<ChunkRead> reads = verified_read_of_a(reader, metadata, destination);
  const std::string file = reads[0].chunk->location.file;
  ASSERT_EQ(::truncate(dir.sub(file).c_str(), 0), 0);
  try {
    reader.read_data(reads);
    FAIL() << "read a truncated file";
  } catch (const CorruptionError& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.entry(), "a") << message;
    EXPECT_EQ(e.file(), dir.sub(file)) << message;
    EXPECT_EQ(e.offset(), 0) << message;  // the file's size now
    EXPECT_NE(message.find("truncated while being read"), std::string::npos) << message;
  }
}

TEST(DcpDirectLoad, AFileTruncatedAfterOpeningFailsTheLoadAndChangesNothing) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  const std::string file = testing::data_files(dir.path()).at(0);
  StateDict target = two_tensors(7, 7);
  // load reads the metadata itself: truncate right after, before it maps the file.
  class TruncatingReader : public FileSystemReader {
   public:
    TruncatingReader(const std::string& dir, std::string file) : FileSystemReader(dir), file_(std::move(file)) {}
    Metadata read_metadata() override {
      Metadata metadata = FileSystemReader::read_metadata();
      if (::truncate(file_.c_str(), 4096) != 0) throw std::runtime_error("truncate failed");
      return metadata;
    }

   private:
    std::string file_;
  } reader(dir.path(), dir.sub(file));
  try {
    load(target, reader);
    FAIL() << "loaded a truncated checkpoint";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.file(), dir.sub(file)) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(target.at("a").toTensor(), torch::full({1 << 16}, 7.0f)));
  EXPECT_TRUE(torch::equal(target.at("b").toTensor(), torch::full({1 << 16}, 7.0f)));
}

TEST(DcpDirectLoad, VerifiedReadsOnlyCopy) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  FileSystemReader reader(dir.path());
  const Metadata metadata = reader.read_metadata();
  at::Tensor destination = torch::zeros({1 << 16});
  std::vector<ChunkRead> reads = verified_read_of_a(reader, metadata, destination);
  EXPECT_TRUE(torch::equal(destination, torch::zeros({1 << 16}))) << "verify_data wrote the buffer";
  reader.read_data(reads);
  EXPECT_TRUE(torch::equal(destination, torch::full({1 << 16}, 1.0f)));
}

TEST(DcpDirectLoad, DestinationsSharingMemoryTakeTheLastValueAssigned) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  const at::Tensor tied = torch::zeros({1 << 16});
  StateDict target;
  target.insert("a", tied);
  target.insert("b", tied);
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(tied, torch::full({1 << 16}, 2.0f)));

  // Overlapping halves of one buffer: "a" is assigned first, then "b" over part of it.
  const at::Tensor buffer = torch::zeros({3 << 15});
  StateDict halves;
  halves.insert("a", buffer.narrow(0, 0, 1 << 16));
  halves.insert("b", buffer.narrow(0, 1 << 15, 1 << 16));
  load(halves, dir.path());
  EXPECT_TRUE(torch::equal(buffer.narrow(0, 0, 1 << 15), torch::full({1 << 15}, 1.0f)));
  EXPECT_TRUE(torch::equal(buffer.narrow(0, 1 << 15, 1 << 16), torch::full({1 << 16}, 2.0f)));
}

TEST(DcpDirectLoad, ConjugateAndNonContiguousDestinationsGetTheirValues) {
  const ScratchDir dir;
  StateDict saved;
  const at::Tensor values = torch::randn({64, 32}, torch::kComplexFloat);
  saved.insert("c", values);
  saved.insert("t", torch::arange(64 * 32, torch::kFloat).view({64, 32}));
  save(saved, dir.path());
  StateDict target;
  const at::Tensor conjugate = torch::zeros({64, 32}, torch::kComplexFloat).conj();
  ASSERT_TRUE(conjugate.is_conj());
  const at::Tensor transposed = torch::zeros({32, 64}).t();
  target.insert("c", conjugate);
  target.insert("t", transposed);
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(conjugate.resolve_conj(), values));
  EXPECT_TRUE(torch::equal(transposed, saved.at("t").toTensor()));
}

TEST(DcpDirectLoad, LoadBumpsTheVersionOfTensorsItFills) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  StateDict target = two_tensors(0, 0);
  const at::Tensor a = target.at("a").toTensor();
  const auto before = a._version();
  load(target, dir.path());
  EXPECT_GT(a._version(), before);
}

TEST(DcpDirectLoad, AReaderThatCannotVerifyAloneGetsBuffersOfItsOwn) {
  const ScratchDir dir;
  save(two_tensors(1, 2), dir.path());
  class ReadOnlyReader : public FileSystemReader {
   public:
    using FileSystemReader::FileSystemReader;
    bool verify_data(std::vector<ChunkRead>&) override { return false; }
    void read_data(std::vector<ChunkRead>& reads) override {
      for (const ChunkRead& read : reads) {
        for (const void* destination : destinations) {
          if (read.buffer.data_ptr() == destination) wrote_destination = true;
        }
      }
      FileSystemReader::read_data(reads);
    }
    std::vector<const void*> destinations;
    bool wrote_destination = false;
  } reader(dir.path());
  StateDict target = two_tensors(0, 0);
  for (const auto& item : target) reader.destinations.push_back(item.value().toTensor().data_ptr());
  load(target, reader);
  EXPECT_FALSE(reader.wrote_destination);
  EXPECT_TRUE(torch::equal(target.at("a").toTensor(), torch::full({1 << 16}, 1.0f)));
  EXPECT_TRUE(torch::equal(target.at("b").toTensor(), torch::full({1 << 16}, 2.0f)));
}

// per_thread_copy_ahead: device tensors are copied to the host ahead of the writes
// (the test device where the build has one); CPU tensors are written as they are.
TEST(DcpCopyAhead, EveryBudgetSavesTheSameBytes) {
  const c10::Device device = testing::test_device();
  StateDict state;
  for (int i = 0; i < 6; ++i) state.insert("t" + std::to_string(i), torch::randn({1000 + i * 4096}).to(device));
  state.insert("transposed", torch::randn({64, 48}).to(device).t());
  state.insert("conjugate", torch::randn({33}, torch::kComplexFloat).to(device).conj());
  for (const int64_t budget : {int64_t(0), int64_t(1), int64_t(40'000), int64_t(10'000'000)}) {
    const ScratchDir dir;
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().per_thread_copy_ahead(budget).thread_count(2));
    save(state, writer);
    StateDict target;
    for (const auto& item : state) target.insert(item.key(), torch::zeros_like(item.value().toTensor()));
    load(target, dir.path());
    for (const auto& item : state) {
      EXPECT_TRUE(torch::equal(target.at(item.key()).toTensor(), item.value().toTensor()))
          << item.key() << " with per_thread_copy_ahead " << budget;
    }
  }
}

TEST(DcpCopyAhead, CpuTensorsAreTakenWithoutACopy) {
  const at::Tensor contiguous = torch::randn({1000});
  const at::Tensor transposed = torch::randn({20, 30}).t();
  detail::CopyAhead ahead({contiguous, transposed}, /*budget_bytes=*/0);
  EXPECT_EQ(ahead.take(0).data_ptr(), contiguous.data_ptr());
  const at::Tensor taken = ahead.take(1);
  EXPECT_TRUE(taken.is_contiguous());
  EXPECT_TRUE(torch::equal(taken, transposed));
}

}  // namespace
}  // namespace stowage::dcp
