// Env::posix()'s files written over (reuse_file) keep their mapping when closed, for the
// next write over the same file (dcp/storage/kept_mappings.h): that write lands through
// the kept mapping, a file that changed size meanwhile is mapped afresh, and a kept
// mapping whose file is removed gives its pages back. What the process maps is read
// from /proc/self/maps.

#include "dcp/test_util.h"

#include <stowage/dcp/env.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace stowage::dcp::testing {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kBytes = int64_t(1) << 20;

// The sizes of this process's mappings of the file `inode` (any device: the scratch
// directory's inodes are what the test made).
std::vector<int64_t> mappings_of(ino_t inode) {
  std::ifstream maps("/proc/self/maps");
  std::vector<int64_t> sizes;
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, permissions, offset, device;
    uint64_t mapped_inode = 0;
    fields >> range >> permissions >> offset >> device >> mapped_inode;
    if (mapped_inode != inode) continue;
    const size_t dash = range.find('-');
    sizes.push_back(static_cast<int64_t>(std::stoull(range.substr(dash + 1), nullptr, 16) -
                                         std::stoull(range.substr(0, dash), nullptr, 16)));
  }
  return sizes;
}

std::string bytes_of(char fill, int64_t count) {
  return std::string(static_cast<size_t>(count), fill);
}

// Renames `from` to `to` and writes `bytes` over it through Env::posix().
void write_over(const std::string& from, const std::string& to, const std::string& bytes) {
  const std::unique_ptr<WritableFile> file = Env::posix()->reuse_file(from, to);
  file->write_at(bytes.data(), static_cast<int64_t>(bytes.size()), 0);
  file->close();
}

TEST(KeptMappings, ASecondWriteOverTheSameFileGoesThroughTheMappingTheFirstKept) {
  const ScratchDir dir;
  write_file(dir.sub("a"), bytes_of('a', kBytes));
  const ino_t inode = inode_of(dir.sub("a"));
  write_over(dir.sub("a"), dir.sub("b"), bytes_of('b', kBytes));
  EXPECT_EQ(mappings_of(inode), std::vector<int64_t>{kBytes}) << "the closed file's mapping was not kept";
  write_over(dir.sub("b"), dir.sub("c"), bytes_of('c', kBytes));
  EXPECT_EQ(mappings_of(inode), std::vector<int64_t>{kBytes}) << "the second write mapped the file again";
  EXPECT_EQ(read_file(dir.sub("c")), bytes_of('c', kBytes));
  Env::posix()->remove_file(dir.sub("c"));
}

TEST(KeptMappings, AKeptMappingIsReleasedWhenItsFileIsRemovedThroughTheEnvOrOtherwise) {
  const ScratchDir dir;
  write_file(dir.sub("a"), bytes_of('a', kBytes));
  write_file(dir.sub("x"), bytes_of('x', kBytes));
  const ino_t removed_by_env = inode_of(dir.sub("a"));
  const ino_t removed_otherwise = inode_of(dir.sub("x"));
  write_over(dir.sub("a"), dir.sub("b"), bytes_of('b', kBytes));
  write_over(dir.sub("x"), dir.sub("y"), bytes_of('y', kBytes));
  Env::posix()->remove_tree(dir.sub("b"));
  EXPECT_TRUE(mappings_of(removed_by_env).empty()) << "a removed file's pages stay mapped";
  fs::remove(dir.sub("y"));
  write_file(dir.sub("m"), bytes_of('m', kBytes));
  write_over(dir.sub("m"), dir.sub("n"), bytes_of('n', kBytes));  // the next write over looks
  EXPECT_TRUE(mappings_of(removed_otherwise).empty()) << "a file removed behind the Env's back stays mapped";
  Env::posix()->remove_file(dir.sub("n"));
}

TEST(KeptMappings, AFileThatChangedSizeSinceItsMappingWasKeptIsMappedAfresh) {
  const ScratchDir dir;
  write_file(dir.sub("a"), bytes_of('a', kBytes));
  const ino_t inode = inode_of(dir.sub("a"));
  write_over(dir.sub("a"), dir.sub("b"), bytes_of('b', kBytes));
  fs::resize_file(dir.sub("b"), 4 * kBytes);
  write_over(dir.sub("b"), dir.sub("c"), bytes_of('c', 4 * kBytes));  // past the kept mapping's end
  EXPECT_EQ(read_file(dir.sub("c")), bytes_of('c', 4 * kBytes));
  EXPECT_EQ(mappings_of(inode), std::vector<int64_t>{4 * kBytes});
  fs::resize_file(dir.sub("c"), kBytes / 2);
  write_over(dir.sub("c"), dir.sub("d"), bytes_of('d', kBytes / 2));  // through the kept mapping: past the end
  EXPECT_EQ(read_file(dir.sub("d")), bytes_of('d', kBytes / 2));
  EXPECT_EQ(mappings_of(inode), std::vector<int64_t>{kBytes / 2});
  Env::posix()->remove_file(dir.sub("d"));
}

}  // namespace
}  // namespace stowage::dcp::testing
