#pragma once

// Helpers shared by the dcp tests: a scratch directory, the test device, file surgery,
// free ports.

#include <stowage/dcp/dcp.h>

#include "process_groups.h"
#include "test_device.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

namespace stowage::dcp::testing {

// A fresh directory under the system temp directory, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/stowage-dcp-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

using stowage::testing::test_device;

inline StateDict state_of(std::initializer_list<std::pair<std::string, c10::IValue>> items) {
  StateDict state;
  for (const auto& [key, value] : items) state.insert(key, value);
  return state;
}

inline std::vector<std::string> list_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline std::vector<std::string> data_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const std::string& name : list_files(dir)) {
    if (name.rfind("data-", 0) == 0) names.push_back(name);
  }
  return names;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline ino_t inode_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_ino;
}

inline std::string metadata_path(const std::string& dir) {
  return dir + "/" + kMetadataFileName;
}

using stowage::testing::free_port;

}  // namespace stowage::dcp::testing
