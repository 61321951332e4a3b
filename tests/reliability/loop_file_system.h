#pragma once

// A real ext4 file system on a loop device, for the tests that need the kernel's own EIO
// and ENOSPC (tests/reliability/io_error_test.cpp, swap_disk_io_test.cpp). Needs root
// and loop devices; where they are missing, unavailable() says why and the tests skip.

#include "dcp/test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace stowage::reliability {

// An ext4 file system (4 KiB blocks, no journal so that a failed write cannot abort the
// whole file system, errors=continue) in a sparse image file under a fresh scratch
// directory, attached to a free loop device and mounted for the object's lifetime.
// Everything is undone by the destructor, whatever the test did; the loop device is
// also marked autoclear, so the kernel releases it once the mount and our descriptor
// are gone even if the destructor never runs.
class LoopFileSystem {
 public:
  static constexpr int64_t kImageBytes = 64 << 20;

  LoopFileSystem() : image_(scratch_.sub("ext4.img")), mount_point_(scratch_.sub("mnt")) {
    if (std::system("command -v mkfs.ext4 >/dev/null 2>&1") != 0) {
      unavailable_ = "mkfs.ext4 is not installed (scripts/setup.sh installs e2fsprogs)";
      return;
    }
    {
      const int fd = ::open(image_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0 || ::ftruncate(fd, kImageBytes) != 0) {
        unavailable_ = fmt::format("cannot create the image '{}': {}", image_, std::strerror(errno));
        if (fd >= 0) ::close(fd);
        return;
      }
      ::close(fd);
    }
    const std::string mkfs = fmt::format(
        "mkfs.ext4 -q -F -b 4096 -m 0 -O ^has_journal -E lazy_itable_init=0,nodiscard '{}' >/dev/null 2>&1", image_);
    if (std::system(mkfs.c_str()) != 0) {
      unavailable_ = "mkfs.ext4 failed on " + image_;
      return;
    }
    if (!attach_loop_device()) return;
    std::filesystem::create_directory(mount_point_);
    if (::mount(loop_path_.c_str(), mount_point_.c_str(), "ext4", 0, "errors=continue") != 0) {
      unavailable_ = fmt::format("cannot mount ext4 from {}: {}", loop_path_, std::strerror(errno));
      return;
    }
    mounted_ = true;
  }

  ~LoopFileSystem() {
    if (mounted_ && ::umount2(mount_point_.c_str(), 0) != 0) ::umount2(mount_point_.c_str(), MNT_DETACH);
    if (loop_fd_ >= 0) {
      ::ioctl(loop_fd_, LOOP_CLR_FD, 0);  // EBUSY after a lazy unmount: autoclear finishes it
      ::close(loop_fd_);
    }
  }

  LoopFileSystem(const LoopFileSystem&) = delete;
  LoopFileSystem& operator=(const LoopFileSystem&) = delete;

  // Empty when mounted, else why not (the test skips with it).
  const std::string& unavailable() const { return unavailable_; }
  std::string sub(const std::string& name) const { return mount_point_ + "/" + name; }
  int64_t free_bytes() const {
    struct statvfs info {};
    ::statvfs(mount_point_.c_str(), &info);
    return static_cast<int64_t>(info.f_bfree) * static_cast<int64_t>(info.f_bsize);
  }

  // Where the used part of the file system ends when its free blocks are all at the end
  // (a fresh file system filled in order): what `cut_device_at` needs to fail every new
  // allocation. Free holes further down make this lower, which only moves the cut into
  // the last written file.
  int64_t end_of_used_space() const { return (kImageBytes - free_bytes()) / 4096 * 4096; }

  // Shrinks the device under the mounted file system to `bytes`: I/O past it fails
  // with EIO ("attempt to access beyond end of device").
  void cut_device_at(int64_t bytes) {
    ASSERT_EQ(::truncate(image_.c_str(), bytes), 0) << std::strerror(errno);
    ASSERT_EQ(::ioctl(loop_fd_, LOOP_SET_CAPACITY, 0), 0) << std::strerror(errno);
    uint64_t device_bytes = 0;
    ASSERT_EQ(::ioctl(loop_fd_, BLKGETSIZE64, &device_bytes), 0) << std::strerror(errno);
    ASSERT_EQ(static_cast<int64_t>(device_bytes), bytes);
  }

 private:
  bool attach_loop_device() {
    const int control = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (control < 0) {
      unavailable_ = fmt::format("cannot open /dev/loop-control: {}", std::strerror(errno));
      return false;
    }
    const int image_fd = ::open(image_.c_str(), O_RDWR | O_CLOEXEC);
    // Another process may take the free device between the two calls: try again.
    for (int attempt = 0; attempt < 8 && loop_fd_ < 0; ++attempt) {
      const int number = ::ioctl(control, LOOP_CTL_GET_FREE);
      if (number < 0) {
        unavailable_ = fmt::format("no free loop device: {}", std::strerror(errno));
        break;
      }
      const std::string path = "/dev/loop" + std::to_string(number);
      const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) {
        unavailable_ = fmt::format("cannot open {}: {}", path, std::strerror(errno));
        break;
      }
      if (::ioctl(fd, LOOP_SET_FD, image_fd) != 0) {
        unavailable_ = fmt::format("cannot attach {} to {}: {}", image_, path, std::strerror(errno));
        ::close(fd);
        if (errno == EBUSY) continue;
        break;
      }
      loop_fd_ = fd;
      loop_path_ = path;
      struct loop_info64 info {};
      info.lo_flags = LO_FLAGS_AUTOCLEAR;
      ::ioctl(loop_fd_, LOOP_SET_STATUS64, &info);
      unavailable_.clear();
    }
    ::close(image_fd);
    ::close(control);
    return loop_fd_ >= 0;
  }

  dcp::testing::ScratchDir scratch_;
  std::string image_;
  std::string mount_point_;
  std::string loop_path_;
  int loop_fd_ = -1;
  bool mounted_ = false;
  std::string unavailable_ = "not set up";
};

}  // namespace stowage::reliability
