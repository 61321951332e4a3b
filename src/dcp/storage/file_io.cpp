#include "dcp/storage/file_io.h"
#include "util/errno_error.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <random>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace stowage::dcp::detail {

namespace {

FileType type_of(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISFIFO(mode)) return FileType::kFifo;
  if (S_ISSOCK(mode)) return FileType::kSocket;
  if (S_ISCHR(mode)) return FileType::kCharacterDevice;
  if (S_ISBLK(mode)) return FileType::kBlockDevice;
  return FileType::kSymbolicLink;
}

Error not_a_regular_file(const std::string& path, FileType type) {
  return Error(fmt::format("'{}' is {}, not a regular file", path, describe(type)));
}

void refuse_unless_regular_or_absent(const std::string& path, FileType type) {
  if (type != FileType::kRegular && type != FileType::kAbsent) throw not_a_regular_file(path, type);
}

}  // namespace

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  close();
}

void File::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

File File::create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) util::throw_errno(fmt::format("cannot create '{}'", path), path, "create", errno);
  return File(fd, path);
}

File File::open_for_reading(const std::string& path) {
  // Checked before opening: opening a FIFO blocks until it has a writer, and opening a
  // device node can act on the device. O_NONBLOCK and the second check cover an object
  // swapped in between the two calls.
  refuse_unless_regular_or_absent(path, file_type_at(path));
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) util::throw_errno(fmt::format("cannot open '{}'", path), path, "open", errno);
  File file(fd, path);
  struct stat info {};
  if (::fstat(fd, &info) != 0) util::throw_errno(fmt::format("cannot stat '{}'", path), path, "stat", errno);
  if (!S_ISREG(info.st_mode)) throw not_a_regular_file(path, type_of(info.st_mode));
  if (::fcntl(fd, F_SETFL, 0) != 0) util::throw_errno(fmt::format("cannot open '{}'", path), path, "open", errno);
  return file;
}

void File::write_at(const void* data, int64_t length, int64_t offset) const {
  const char* p = static_cast<const char*>(data);
  while (length > 0) {
    const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(std::min<int64_t>(length, int64_t(1) << 30)), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      util::throw_errno(fmt::format("cannot write '{}' at offset {}", path_, offset), path_, "write", errno);
    }
    p += n;
    offset += n;
    length -= n;
  }
}

void File::read_at(void* data, int64_t length, int64_t offset) const {
  char* p = static_cast<char*>(data);
  while (length > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(std::min<int64_t>(length, int64_t(1) << 30)), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      util::throw_errno(fmt::format("cannot read '{}' at offset {}", path_, offset), path_, "read", errno);
    }
    if (n == 0)
      throw CorruptionError(fmt::format("short read: '{}' ends at offset {}", path_, offset), "", path_, offset);
    p += n;
    offset += n;
    length -= n;
  }
}

int64_t File::size() const {
  struct stat info {};
  if (::fstat(fd_, &info) != 0) util::throw_errno(fmt::format("cannot stat '{}'", path_), path_, "stat", errno);
  return static_cast<int64_t>(info.st_size);
}

void File::start_writeback(int64_t offset, int64_t length) const {
#if defined(__linux__)
  // Only a hint: sync() reports what fails.
  ::sync_file_range(fd_, offset, length, SYNC_FILE_RANGE_WRITE);
#else
  (void)offset;
  (void)length;
#endif
}

void File::sync() const {
  if (::fsync(fd_) != 0) util::throw_errno(fmt::format("cannot fsync '{}'", path_), path_, "fsync", errno);
}

std::string join_path(const std::string& directory, const std::string& name) {
  return (std::filesystem::path(directory) / name).string();
}

FileType file_type_at(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) {
    // ENOTDIR: a component of the path is not a directory, so nothing is there either.
    if (errno == ENOENT || errno == ENOTDIR) return FileType::kAbsent;
    util::throw_errno(fmt::format("cannot stat '{}'", path), path, "stat", errno);
  }
  return type_of(info.st_mode);
}

bool file_exists(Env& env, const std::string& path) {
  return env.file_type(path) != FileType::kAbsent;
}

void refuse_special_file(Env& env, const std::string& path) {
  refuse_unless_regular_or_absent(path, env.file_type(path));
}

std::string read_text_file(Env& env, const std::string& path) {
  const std::unique_ptr<ReadableFile> file = env.open_for_reading(path);
  std::string text(static_cast<size_t>(file->size()), '\0');
  file->read_at(text.data(), static_cast<int64_t>(text.size()), 0);
  return text;
}

std::string new_save_id() {
  std::random_device device;
  std::mt19937_64 generator((uint64_t(device()) << 32) ^ device() ^
                            uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  return fmt::format("{:016x}", generator());
}

bool is_hex(const std::string& text, size_t from, size_t count) {
  if (text.size() < from + count) return false;
  for (size_t i = from; i < from + count; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

bool is_data_file_name(const std::string& name) {
  return name.rfind("data-", 0) == 0 && is_hex(name, 5, 16) && name.compare(21, 2, "-r") == 0 && name.size() > 28 &&
         name.compare(name.size() - 5, 5, ".data") == 0;
}

}  // namespace stowage::dcp::detail
