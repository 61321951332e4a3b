#include "dcp/storage/overwritten_file.h"

#include "util/errno_error.h"
#include "util/streaming_copy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace stowage::dcp::detail {

std::unique_ptr<WritableFile> OverwrittenFile::open(const std::string& from, const std::string& to,
                                                    KeptMappings& kept) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    util::throw_errno(fmt::format("cannot rename '{}' to '{}'", from, to), to, "rename", errno);
  }
  const int fd = ::open(to.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) util::throw_errno(fmt::format("cannot open '{}' to write over it", to), to, "open", errno);
  File file(fd, to);
  struct stat info {};
  if (::fstat(fd, &info) != 0) util::throw_errno(fmt::format("cannot stat '{}'", to), to, "stat", errno);
  if (!S_ISREG(info.st_mode)) util::throw_errno(fmt::format("'{}' is not a regular file", to), to, "open", EINVAL);
  const auto mapped = static_cast<int64_t>(info.st_size);
  char* mapping = mapped > 0 ? kept.take(fd, mapped) : nullptr;
  if (mapped > 0 && mapping == nullptr) {
    void* map = ::mmap(nullptr, static_cast<size_t>(mapped), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) util::throw_errno(fmt::format("cannot map '{}'", to), to, "mmap", errno);
    mapping = static_cast<char*>(map);
  }
  return std::unique_ptr<WritableFile>(new OverwrittenFile(std::move(file), mapping, mapped, kept));
}

OverwrittenFile::OverwrittenFile(File file, char* mapping, int64_t mapped, KeptMappings& kept)
    : file_(std::move(file)), kept_(kept), mapping_(mapping), mapped_(mapped) {}

OverwrittenFile::~OverwrittenFile() {
  unmap();
}

void OverwrittenFile::unmap() noexcept {
  if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(mapped_));
  mapping_ = nullptr;
}

void OverwrittenFile::write_at(const void* data, int64_t length, int64_t offset) {
  const int64_t into_mapping = mapping_ == nullptr ? 0 : std::clamp<int64_t>(mapped_ - offset, 0, length);
  if (into_mapping > 0) util::copy_streaming(mapping_ + offset, data, static_cast<size_t>(into_mapping));
  if (into_mapping < length) {
    file_.write_at(static_cast<const char*>(data) + into_mapping, length - into_mapping, offset + into_mapping);
  }
  end_ = std::max(end_, offset + length);
}

void OverwrittenFile::start_writeback(int64_t offset, int64_t length) {
  file_.start_writeback(offset, length);
}

void OverwrittenFile::sync() {
  if (mapping_ != nullptr && ::msync(mapping_, static_cast<size_t>(mapped_), MS_SYNC) != 0) {
    util::throw_errno(fmt::format("cannot sync '{}'", path()), path(), "fsync", errno);
  }
  file_.sync();
}

void OverwrittenFile::close() {
  if (!file_.is_open()) return;
  if (mapping_ != nullptr && end_ == mapped_) {
    kept_.keep(file_.fd(), mapping_, mapped_);  // written over whole: it covers the file still
    mapping_ = nullptr;
  }
  unmap();
  if (::ftruncate(file_.fd(), end_) != 0) {  // a no-op when written over whole
    util::throw_errno(fmt::format("cannot truncate '{}' to {} bytes", path(), end_), path(), "truncate", errno);
  }
  file_.close();
}

}  // namespace stowage::dcp::detail
