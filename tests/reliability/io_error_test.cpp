// A real EIO from the kernel: an ext4 file system on a loop device whose device is then
// shrunk below the file system's free space (the backing file truncated, the loop
// capacity re-read). Blocks the file system allocates from then on lie past the end of
// the device, so their writeback fails and fsync returns EIO; clean pages dropped from
// the cache read back with EIO. Saves must fail with the cause and the file, leave the
// committed checkpoint and the directory as they were, and leak nothing; a load must
// fail the same way and leave its target untouched.

#include "dcp/test_util.h"
#include "reliability/failing_save.h"
#include "reliability/file_space.h"
#include "reliability/generations.h"
#include "reliability/loop_file_system.h"
#include "reliability/report.h"
#include "reliability/resources.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;
namespace fs = std::filesystem;

// Drops the clean cached pages of the files `names` in `dir`, so that the next read goes
// to the device.
void drop_cached_pages(const std::string& dir, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0) << path;
    ::close(fd);
  }
}

std::vector<std::string> data_files(const std::vector<std::string>& names) {
  std::vector<std::string> data;
  for (const std::string& name : names) {
    if (name.rfind("data-", 0) == 0) data.push_back(name);
  }
  return data;
}

TEST(IoErrors, SavesHittingEIOFailCleanlyAndLeakNothing) {
  LoopFileSystem disk;
  if (!disk.unavailable().empty()) GTEST_SKIP() << "no loop-mounted ext4 here: " << disk.unavailable();
  const std::string dir = disk.sub("ckpt");
  dcp::save(generation_state(1), dir);
  const std::vector<std::string> committed = dcp::testing::list_files(dir);
  // The checkpoint lies at the start of the file system, the filler after it; 8 MiB
  // stay free, past the cut.
  fill_synced(disk.sub("filler"), disk.free_bytes() - (8 << 20));
  disk.cut_device_at(disk.end_of_used_space());
  if (::testing::Test::HasFatalFailure()) return;
  // The committed checkpoint reads back from the device, not from the page cache.
  drop_cached_pages(dir, committed);
  {
    StateDict loaded = generation_state(-1);
    dcp::load(loaded, dir);
    ASSERT_EQ(compare_to_generation(loaded, 1), "");
  }

  dcp::DefaultStager background;
  StateDict training = generation_state(2);
  background.stage(dcp::SaveableState(training));  // its buffers are cached from here on: not a leak
  const Resources before;
  int64_t failures = 0;
  for (int round = 0; round < 2; ++round) {
    for (const SaveConfig& config : kSaveConfigs) {
      SCOPED_TRACE(fmt::format("{} single_file={} threads={}", config.stager, config.single_file, config.threads));
      const FailedSave failed =
          failing_save(dir, config, training, background, 3 + round, "on a device that fails every new block");
      const std::string& message = failed.message;
      EXPECT_EQ(failed.error_number, EIO) << message;
      EXPECT_NE(failed.path.find(dir + "/"), std::string::npos) << failed.path;
      EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
      EXPECT_NE(message.find(dir + "/"), std::string::npos) << "the message names no file: " << message;
      if (failures == 0) std::printf("[first error] %s\n", message.c_str());
      ++failures;
      // No metadata committed, nothing left behind, the previous checkpoint exactly as it was.
      EXPECT_EQ(dcp::testing::list_files(dir), committed);
      drop_cached_pages(dir, committed);
      StateDict loaded = generation_state(-1);
      dcp::load(loaded, dir);
      EXPECT_EQ(compare_to_generation(loaded, 1), "");
    }
  }
  record_figure("io_error.eio_saves_failed_cleanly", failures);
  expect_nothing_leaked_since(before, "io_error");
}

TEST(IoErrors, ALoadHittingEIOFailsAndLeavesItsTargetUntouched) {
  LoopFileSystem disk;
  if (!disk.unavailable().empty()) GTEST_SKIP() << "no loop-mounted ext4 here: " << disk.unavailable();
  // Filler first, then the checkpoint: its data lies past the cut.
  fill_synced(disk.sub("filler"), disk.free_bytes() - (8 << 20));
  const int64_t cut = disk.end_of_used_space();
  const std::string dir = disk.sub("ckpt");
  {
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().single_file_per_rank(false));
    dcp::save(generation_state(1), writer);
  }
  const std::vector<std::string> committed = dcp::testing::list_files(dir);
  {
    StateDict loaded = generation_state(-1);
    dcp::load(loaded, dir);  // also starts whatever threads a load starts once
    ASSERT_EQ(compare_to_generation(loaded, 1), "");
  }
  disk.cut_device_at(cut);
  if (::testing::Test::HasFatalFailure()) return;
  // The metadata stays cached and readable; the data must come from the device.
  drop_cached_pages(dir, data_files(committed));
  const Resources before;
  StateDict loaded = generation_state(-1);
  std::string message;
  try {
    dcp::load(loaded, dir);
    ADD_FAILURE() << "the load read data the device does not have";
  } catch (const IoError& e) {
    message = e.what();
    EXPECT_EQ(e.error_number(), EIO) << message;
    EXPECT_EQ(e.operation(), "read") << message;
    EXPECT_NE(e.path().find(dir + "/data-"), std::string::npos) << e.path();
  } catch (const Error& e) {
    message = e.what();
    ADD_FAILURE() << "not an IoError: " << message;
  }
  EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
  EXPECT_NE(message.find(dir + "/data-"), std::string::npos) << "the message names no data file: " << message;
  std::printf("[error] %s\n", message.c_str());
  EXPECT_EQ(compare_to_generation(loaded, -1), "") << "a failed load changed the target";
  EXPECT_EQ(dcp::testing::list_files(dir), committed);
  expect_nothing_leaked_since(before);
  record_figure("io_error.eio_loads_failed_cleanly", 1);
}

}  // namespace
}  // namespace stowage::reliability
