// Orphan cleanup (include/stowage/dcp/filesystem.h): the next save removes what a
// crashed save left, never a file of a save still in flight, and never a file that
// is not of stowage's naming.

#include "dcp/test_util.h"
#include "reliability/generations.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;

const std::vector<std::string> kCrashLeftovers = {
    "data-0123456789abcdef-r0-0.data", "data-0123456789abcdef-r1-i12.data", ".metadata.json.tmp-0123456789abcdef"};
const std::vector<std::string> kForeign = {"notes.txt", "data-mine.data", ".metadata.json.tmp-mine",
                                           "data-0123456789abcdef-r0-0.data.bak"};

TEST(OrphanCleanup, TheNextSaveRemovesWhatACrashedSaveLeft) {
  const ScratchDir dir;
  dcp::save(generation_state(1), dir.path());
  for (const std::string& name : kCrashLeftovers) dcp::testing::write_file(dir.sub(name), "left by a crash");
  for (const std::string& name : kForeign) dcp::testing::write_file(dir.sub(name), "not ours");
  const dcp::Metadata second = dcp::save(generation_state(2), dir.path());
  std::vector<std::string> expected = second.files();
  expected.push_back(dcp::kMetadataFileName);
  expected.insert(expected.end(), kForeign.begin(), kForeign.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(dcp::testing::list_files(dir.path()), expected);
}

TEST(OrphanCleanup, DataFilesStayWhenTheCommittedMetadataIsUnreadable) {
  const ScratchDir dir;
  const dcp::Metadata first = dcp::save(generation_state(1), dir.path());
  dcp::testing::write_file(dcp::testing::metadata_path(dir.path()), "{ damaged");
  for (const std::string& name : kCrashLeftovers) dcp::testing::write_file(dir.sub(name), "left by a crash");
  dcp::save(generation_state(2), dir.path());
  // Whose files are whose cannot be known: the unreadable checkpoint's and the crash's stay.
  for (const std::string& name : first.files()) EXPECT_TRUE(std::filesystem::exists(dir.sub(name))) << name;
  EXPECT_TRUE(std::filesystem::exists(dir.sub(kCrashLeftovers[0])));
  EXPECT_FALSE(std::filesystem::exists(dir.sub(kCrashLeftovers[2])));  // a temporary metadata file is never needed
}

// Blocks after its first item until released.
class PausingWriter : public dcp::FileSystemWriter {
 public:
  using FileSystemWriter::FileSystemWriter;
  void wait_until_paused() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return paused_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }

 protected:
  void on_item_written(const dcp::WriteResult&) override {
    std::unique_lock<std::mutex> lock(mutex_);
    paused_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool paused_ = false, released_ = false;
};

TEST(OrphanCleanup, ASaveInFlightKeepsItsFiles) {
  const ScratchDir dir;
  const dcp::Metadata first = dcp::save(generation_state(1), dir.path());
  PausingWriter slow(dir.path(), dcp::FileSystemWriterOptions().single_file_per_rank(false));
  dcp::AsyncSaveResponse pending = dcp::async_save(generation_state(2), slow);
  slow.wait_until_paused();
  std::vector<std::string> in_flight;
  for (const std::string& name : dcp::testing::data_files(dir.path())) {
    const std::vector<std::string> old = first.files();
    if (std::find(old.begin(), old.end(), name) == old.end()) in_flight.push_back(name);
  }
  ASSERT_FALSE(in_flight.empty());
  // Another writer saves meanwhile: the slow save's files are not orphans.
  dcp::save(generation_state(3), dir.path());
  for (const std::string& name : in_flight) EXPECT_TRUE(std::filesystem::exists(dir.sub(name))) << name;
  slow.release();
  pending.upload_completion.get();  // commits generation 2 over 3, with all its files
  StateDict loaded = generation_state(-1);
  dcp::load(loaded, dir.path());
  EXPECT_EQ(compare_to_generation(loaded, 2), "");
}

}  // namespace
}  // namespace stowage::reliability
