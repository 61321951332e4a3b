#pragma once

// Filling a small file system to a chosen amount of free space, for the full-disk and
// I/O-error tests. (Each measures its free space its own way: ext4 keeps blocks back
// from f_bavail, and the EIO test needs the truly free ones.)

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace stowage::reliability {

// Writes `bytes` to the new file `path` and syncs them, so that their blocks are
// allocated on disk.
inline void fill_synced(const std::string& path, int64_t bytes) {
  const std::string block(1 << 20, 'x');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  for (int64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(bytes - done, static_cast<int64_t>(block.size())));
    const ssize_t written = ::write(fd, block.data(), n);
    ASSERT_GT(written, 0) << path << ": " << std::strerror(errno);
    done += written;
  }
  ASSERT_EQ(::fsync(fd), 0) << path << ": " << std::strerror(errno);
  ::close(fd);
}

}  // namespace stowage::reliability
