#include "optim/swap_file.h"

#include <stowage/error.h>

#include "optim/swap_internal.h"
#include "util/errno_error.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace stowage::optim::detail {
namespace {

[[noreturn]] void fail(const std::string& operation, const std::string& path, int error_number) {
  util::throw_errno(fmt::format("Swap optimizer disk tier: cannot {} the scratch file '{}'", operation, path), path,
                    operation, error_number);
}

std::string unique_name(const std::string& dir, const std::string& stem) {
  static std::atomic<int64_t> counter{0};
  return fmt::format("{}/{}-{}-{}.swap", dir, stem, ::getpid(), counter++);
}

}  // namespace

std::shared_ptr<SwapFile> SwapFile::create(const std::string& dir, const std::string& stem, int64_t bytes) {
  std::shared_ptr<SwapFile> file(new SwapFile());
  file->name_ = unique_name(dir, stem);
  file->size_ = std::max<int64_t>(align_up(bytes, kDiskAlignmentBytes), kDiskAlignmentBytes);
  const char* path = file->name_.c_str();
  file->fd_ = ::open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (file->fd_ < 0) fail("create", file->name_, errno);
  // Both descriptors are opened by name before the name goes; from then on the file
  // lives only as long as they do.
  file->io_fd_ = ::open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
  file->direct_ = file->io_fd_ >= 0;
  if (!file->direct_) file->io_fd_ = ::dup(file->fd_);
  const int open_error = errno;
  ::unlink(path);
  if (file->io_fd_ < 0) fail("open", file->name_, open_error);
  if (const int error = ::posix_fallocate(file->fd_, 0, file->size_); error != 0) fail("allocate", file->name_, error);
  file->mapping_ = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd_, 0);
  if (file->mapping_ == MAP_FAILED) {
    file->mapping_ = nullptr;
    fail("mmap", file->name_, errno);
  }
  return file;
}

SwapFile::~SwapFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
  if (io_fd_ >= 0) ::close(io_fd_);
  if (fd_ >= 0) ::close(fd_);
}

at::Tensor SwapFile::map(const std::shared_ptr<SwapFile>& file, c10::ScalarType dtype) {
  const int64_t numel = file->size_ / static_cast<int64_t>(c10::elementSize(dtype));
  return at::from_blob(
      file->mapping_, {numel}, [file](void*) {}, at::TensorOptions().dtype(dtype));
}

}  // namespace stowage::optim::detail
