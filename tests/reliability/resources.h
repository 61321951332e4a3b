#pragma once

// What a failed save must not leak: open descriptors, threads and host buffer bytes of
// this process, counted before and compared after.

#include <stowage/memory/host_buffer.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace stowage::reliability {

inline size_t entries_in(const char* dir) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++count;
  }
  return count;
}

struct Resources {
  size_t fds = entries_in("/proc/self/fd");
  size_t threads = entries_in("/proc/self/task");
  int64_t host_bytes = memory::host_buffer_stats().current_bytes;
};

}  // namespace stowage::reliability
