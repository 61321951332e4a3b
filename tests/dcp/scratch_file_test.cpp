// Env::posix()'s scratch files and their batch I/O (dcp/env.h), which the swap optimizer's
// disk tier runs on: a file unlinked as soon as it is made and allocated in full, batches
// across files and blocks written and read back through either path and seen through the
// mapping, a read past the end failing with EIO and naming the file, and a file of another
// Env refused.

#include "dcp/test_util.h"

#include <stowage/dcp/env.h>
#include <stowage/error.h>

#include <gmock/gmock.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

namespace stowage::dcp {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

// `bytes` (a multiple of kDirectIoAlignment) aligned as a direct file's batch I/O needs,
// each byte `fill`.
std::shared_ptr<char> aligned_batch_buffer(int64_t bytes, char fill) {
  std::shared_ptr<char> buffer(static_cast<char*>(std::aligned_alloc(kDirectIoAlignment, bytes)), std::free);
  std::memset(buffer.get(), fill, bytes);
  return buffer;
}

class DcpBatchIo : public ::testing::TestWithParam<BatchIoPath> {};

TEST_P(DcpBatchIo, WritesAndReadsBackABatchAcrossFilesAndBlocks) {
  const ScratchDir dir;
  Env* env = Env::posix();
  // More than one block (BatchIo::kBlockBytes) each, and sizes rounded up to the alignment.
  const int64_t bytes = 3 * BatchIo::kBlockBytes + 100;
  const auto first = env->create_scratch_file(dir.path(), "first", bytes);
  const auto second = env->create_scratch_file(dir.path(), "second", bytes);
  EXPECT_EQ(first->size(), 3 * BatchIo::kBlockBytes + kDirectIoAlignment);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));  // unlinked already
  EXPECT_THAT(first->path(), HasSubstr(dir.path() + "/first"));

  const auto io = env->new_batch_io(GetParam());
  EXPECT_EQ(io->path(), GetParam());
  const int64_t length = 2 * BatchIo::kBlockBytes + kDirectIoAlignment;
  const auto ones = aligned_batch_buffer(length, 1);
  const auto twos = aligned_batch_buffer(length, 2);
  io->run(IoOp::kWrite, {{first.get(), 0, ones.get(), length}, {second.get(), kDirectIoAlignment, twos.get(), length}});

  const auto read_first = aligned_batch_buffer(length, 0);
  const auto read_second = aligned_batch_buffer(length, 0);
  io->run(IoOp::kRead,
          {{first.get(), 0, read_first.get(), length}, {second.get(), kDirectIoAlignment, read_second.get(), length}});
  EXPECT_EQ(std::memcmp(read_first.get(), ones.get(), length), 0);
  EXPECT_EQ(std::memcmp(read_second.get(), twos.get(), length), 0);
  // The mapping sees what the batch wrote, and the zeros around it.
  EXPECT_EQ(std::memcmp(second->mapping() + kDirectIoAlignment, twos.get(), length), 0);
  EXPECT_EQ(second->mapping()[0], 0);
  EXPECT_EQ(first->mapping()[length], 0);
}

TEST_P(DcpBatchIo, AReadPastTheEndFailsWithEioNamingTheFile) {
  const ScratchDir dir;
  Env* env = Env::posix();
  const auto file = env->create_scratch_file(dir.path(), "short", kDirectIoAlignment);
  const auto buffer = aligned_batch_buffer(2 * kDirectIoAlignment, 0);
  try {
    env->new_batch_io(GetParam())->run(IoOp::kRead, {{file.get(), 0, buffer.get(), 2 * kDirectIoAlignment}});
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), EIO);
    EXPECT_EQ(e.operation(), "read");
    EXPECT_EQ(e.path(), file->path());
    EXPECT_THAT(e.what(), HasSubstr("of the scratch file '" + file->path() + "'"));
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, DcpBatchIo, ::testing::Values(BatchIoPath::kIoUring, BatchIoPath::kThreads),
                         [](const auto& info) { return info.param == BatchIoPath::kIoUring ? "IoUring" : "Threads"; });

// A ScratchFile that no Env made.
class ForeignScratchFile final : public ScratchFile {
 public:
  const std::string& path() const override { return path_; }
  int64_t size() const override { return kDirectIoAlignment; }
  bool direct() const override { return false; }
  char* mapping() const override { return nullptr; }

 private:
  std::string path_ = "/elsewhere/foreign.swap";
};

TEST(DcpScratchFile, BatchIoRefusesAFileOfAnotherEnv) {
  ForeignScratchFile foreign;
  const auto buffer = aligned_batch_buffer(kDirectIoAlignment, 0);
  try {
    Env::posix()->new_batch_io(BatchIoPath::kThreads)->run(IoOp::kRead, {{&foreign, 0, buffer.get(), 4096}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'/elsewhere/foreign.swap' was not made by Env::posix()"));
  }
}

TEST(DcpScratchFile, ADirectoryThatIsNotThereIsNamed) {
  try {
    Env::posix()->create_scratch_file("/nonexistent/stowage-scratch", "state", 1);
    FAIL() << "no error";
  } catch (const NotFound& e) {
    EXPECT_EQ(e.operation(), "create");
    EXPECT_THAT(e.what(), HasSubstr("cannot create the scratch file '/nonexistent/stowage-scratch/state-"));
  }
}

}  // namespace
}  // namespace stowage::dcp
