#include "dcp/storage/scratch_file.h"

#include <stowage/error.h>

#include "util/errno_error.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace stowage::dcp::detail {
namespace {

[[noreturn]] void fail(const std::string& operation, const std::string& path, int error_number) {
  util::throw_errno(fmt::format("cannot {} the scratch file '{}'", operation, path), path, operation, error_number);
}

std::string unique_name(const std::string& dir, const std::string& stem) {
  static std::atomic<int64_t> counter{0};
  return fmt::format("{}/{}-{}-{}.swap", dir, stem, ::getpid(), counter++);
}

int64_t round_up(int64_t bytes) {
  return std::max<int64_t>((bytes + kDirectIoAlignment - 1) / kDirectIoAlignment, 1) * kDirectIoAlignment;
}

}  // namespace

std::shared_ptr<PosixScratchFile> PosixScratchFile::create(const std::string& dir, const std::string& stem,
                                                           int64_t bytes) {
  std::shared_ptr<PosixScratchFile> file(new PosixScratchFile());
  file->path_ = unique_name(dir, stem);
  file->size_ = round_up(bytes);
  const char* path = file->path_.c_str();
  file->fd_ = ::open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (file->fd_ < 0) fail("create", file->path_, errno);
  // Both descriptors are opened by name before the name goes; from then on the file
  // lives only as long as they do.
  file->io_fd_ = ::open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
  file->direct_ = file->io_fd_ >= 0;
  if (!file->direct_) file->io_fd_ = ::dup(file->fd_);
  const int open_error = errno;
  ::unlink(path);
  if (file->io_fd_ < 0) fail("open", file->path_, open_error);
  if (const int error = ::posix_fallocate(file->fd_, 0, file->size_); error != 0) fail("allocate", file->path_, error);
  file->mapping_ = ::mmap(nullptr, file->size_, PROT_READ | PROT_WRITE, MAP_SHARED, file->fd_, 0);
  if (file->mapping_ == MAP_FAILED) {
    file->mapping_ = nullptr;
    fail("mmap", file->path_, errno);
  }
  return file;
}

PosixScratchFile::~PosixScratchFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
  if (io_fd_ >= 0) ::close(io_fd_);
  if (fd_ >= 0) ::close(fd_);
}

int io_descriptor(const ScratchFile& file) {
  const auto* posix = dynamic_cast<const PosixScratchFile*>(&file);
  if (posix == nullptr) {
    throw InvalidArgument(
        fmt::format("the scratch file '{}' was not made by Env::posix(), whose batch I/O it is given to", file.path()));
  }
  return posix->io_fd();
}

}  // namespace stowage::dcp::detail
