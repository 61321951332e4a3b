#pragma once

// What a failed save must not leak: open descriptors, threads and host buffer bytes of
// this process, counted before and compared after.

#include "reliability/report.h"

#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace stowage::reliability {

// The names of this process's threads, to say which one a leak check found.
inline std::string thread_names() {
  std::string names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

inline size_t entries_in(const char* dir) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++count;
  }
  return count;
}

// Threads are counted for the whole process: the suite runs with one intra-op thread
// (tests/CMakeLists.txt), so that LibTorch's OpenMP workers, which any thread that runs a
// parallel operation starts (LibTorch 2.x runs two on two cores), are not counted.
struct Resources {
  size_t fds = entries_in("/proc/self/fd");
  size_t threads = entries_in("/proc/self/task");
  int64_t host_bytes = memory::host_buffer_stats().current_bytes;
};

// Expects the counts to be back where they were at `before`. With a figure prefix, also
// records the three differences as "<prefix>.fd_delta", ".thread_delta" and
// ".host_buffer_delta".
inline void expect_nothing_leaked_since(const Resources& before, const std::string& figure_prefix = "") {
  const Resources after;
  EXPECT_EQ(after.fds, before.fds);
  EXPECT_EQ(after.threads, before.threads) << "threads now: " << thread_names();
  EXPECT_EQ(after.host_bytes, before.host_bytes);
  if (figure_prefix.empty()) return;
  record_figure(figure_prefix + ".fd_delta", static_cast<int64_t>(after.fds) - static_cast<int64_t>(before.fds));
  record_figure(figure_prefix + ".thread_delta",
                static_cast<int64_t>(after.threads) - static_cast<int64_t>(before.threads));
  record_figure(figure_prefix + ".host_buffer_delta", after.host_bytes - before.host_bytes);
}

}  // namespace stowage::reliability
