// Full disks and I/O errors, for real: saves into a size-limited tmpfs until ENOSPC, and
// with a low open-file limit (EMFILE). The upload future fails with the cause, the
// training thread goes on, the previous checkpoint stays intact and loadable, and no
// file descriptor, thread or host buffer is left behind (counted before and after).

#include "dcp/test_util.h"
#include "reliability/failing_save.h"
#include "reliability/file_space.h"
#include "reliability/generations.h"
#include "reliability/report.h"
#include "reliability/resources.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;
namespace fs = std::filesystem;

// A tmpfs of `bytes` mounted on a scratch directory for the test's lifetime.
class SmallFileSystem {
 public:
  explicit SmallFileSystem(int64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", scratch_.path().c_str(), "tmpfs", 0, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(scratch_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  std::string sub(const std::string& name) const { return scratch_.sub(name); }
  int64_t free_bytes() const {
    struct statvfs info {};
    ::statvfs(scratch_.path().c_str(), &info);
    return static_cast<int64_t>(info.f_bavail) * static_cast<int64_t>(info.f_frsize);
  }

 private:
  ScratchDir scratch_;
  bool mounted_ = false;
  std::string error_;
};

TEST(FullDisk, SavesIntoAFullFileSystemFailCleanlyAndLeakNothing) {
  const SmallFileSystem disk(8 << 20);
  if (!disk.mounted()) {
    GTEST_SKIP() << "cannot mount a size-limited tmpfs here (" << disk.error()
                 << "); DcpSafety.AFullDiskFailsTheSaveCleanly covers a full disk with RLIMIT_FSIZE";
  }
  const std::string dir = disk.sub("ckpt");
  dcp::save(generation_state(1), dir);
  const std::vector<std::string> committed = dcp::testing::list_files(dir);
  // Leave less room than a generation needs (about 1.5 MiB), but some.
  fill_synced(disk.sub("filler"), disk.free_bytes() - (600 << 10));

  dcp::DefaultStager background;
  int64_t failures = 0;
  StateDict training = generation_state(2);
  background.stage(dcp::SaveableState(training));  // its buffers are cached from here on: not a leak
  const Resources before;
  for (int round = 0; round < 3; ++round) {
    for (const SaveConfig& config : kSaveConfigs) {
      SCOPED_TRACE(fmt::format("{} single_file={} threads={}", config.stager, config.single_file, config.threads));
      const FailedSave failed = failing_save(dir, config, training, background, 3 + round, "on a full file system");
      const std::string& message = failed.message;
      EXPECT_EQ(failed.error_number, ENOSPC) << message;
      EXPECT_NE(failed.path.find(dir + "/"), std::string::npos) << failed.path;
      EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
      EXPECT_TRUE(message.find("data-") != std::string::npos || message.find(".tmp-") != std::string::npos) << message;
      ++failures;
      // The previous checkpoint, exactly as it was.
      EXPECT_EQ(dcp::testing::list_files(dir), committed);
      StateDict loaded = generation_state(-1);
      dcp::load(loaded, dir);
      EXPECT_EQ(compare_to_generation(loaded, 1), "");
    }
  }
  record_figure("full_disk.enospc_saves_failed_cleanly", failures);
  expect_nothing_leaked_since(before, "full_disk");
}

TEST(FullDisk, AFailedMetadataCommitLeavesThePreviousCheckpoint) {
  const SmallFileSystem disk(8 << 20);
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a size-limited tmpfs here (" << disk.error() << ")";
  const std::string dir = disk.sub("ckpt");
  const dcp::Metadata first = dcp::save(generation_state(1), dir);
  const std::vector<std::string> committed = dcp::testing::list_files(dir);
  // Exactly the pages the data files of a save take: the data fits, the metadata does not.
  int64_t data_pages = 0;
  for (const std::string& name : first.files()) {
    data_pages += (static_cast<int64_t>(fs::file_size(dir + "/" + name)) + 4095) / 4096;
  }
  fill_synced(disk.sub("filler"), disk.free_bytes() - data_pages * 4096);
  ASSERT_EQ(disk.free_bytes(), data_pages * 4096);
  try {
    dcp::save(generation_state(2), dir);
    ADD_FAILURE() << "the save fit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".metadata.json.tmp-"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dcp::testing::list_files(dir), committed);
  StateDict loaded = generation_state(-1);
  dcp::load(loaded, dir);
  EXPECT_EQ(compare_to_generation(loaded, 1), "");
}

TEST(IoErrors, RunningOutOfFileDescriptorsFailsSavesAndLoadsCleanly) {
  const ScratchDir scratch;
  const std::string dir = scratch.sub("ckpt");
  {
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().single_file_per_rank(false));
    dcp::save(generation_state(1), writer);  // seven data files: more than a load may open
  }
  const std::vector<std::string> committed = dcp::testing::list_files(dir);
  const Resources before;
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = before.fds + 64;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  // Take every descriptor but one: the save's directory lock gets it, its first data
  // file does not; the load reads its metadata with it, then cannot open a second file.
  std::vector<int> taken;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) taken.push_back(fd);
  ASSERT_EQ(errno, EMFILE);
  ASSERT_FALSE(taken.empty());
  ::close(taken.back());
  taken.pop_back();
  std::string save_error, load_error;
  try {
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().single_file_per_rank(false).thread_count(3));
    dcp::save(generation_state(2), writer);
  } catch (const Error& e) {
    save_error = e.what();
  }
  StateDict loaded = generation_state(-1);
  try {
    dcp::load(loaded, dir);
  } catch (const Error& e) {
    load_error = e.what();
  }
  for (int fd : taken) ::close(fd);
  ::setrlimit(RLIMIT_NOFILE, &old_limit);
  EXPECT_NE(save_error.find("Too many open files"), std::string::npos) << save_error;
  EXPECT_NE(load_error.find("Too many open files"), std::string::npos) << load_error;
  EXPECT_EQ(compare_to_generation(loaded, -1), "") << "a failed load changed the target";
  EXPECT_EQ(dcp::testing::list_files(dir), committed);
  dcp::load(loaded, dir);
  EXPECT_EQ(compare_to_generation(loaded, 1), "");
  expect_nothing_leaked_since(before);
}

}  // namespace
}  // namespace stowage::reliability
