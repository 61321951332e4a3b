// Env::posix(): the Env of the process's file system, made of file_io.h's checked calls,
// scratch_file.h's files and batch_io.h's reads and writes of them.
#include "dcp/storage/batch_io.h"
#include "dcp/storage/file_io.h"
#include "dcp/storage/kept_mappings.h"
#include "dcp/storage/mapped_file.h"
#include "dcp/storage/overwritten_file.h"
#include "dcp/storage/scratch_file.h"
#include "util/errno_error.h"

#include <stowage/dcp/env.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

class PosixWritableFile final : public WritableFile {
 public:
  explicit PosixWritableFile(detail::File file) : file_(std::move(file)) {}
  const std::string& path() const override { return file_.path(); }
  void write_at(const void* data, int64_t length, int64_t offset) override { file_.write_at(data, length, offset); }
  void start_writeback(int64_t offset, int64_t length) override { file_.start_writeback(offset, length); }
  void sync() override { file_.sync(); }
  void close() override { file_.close(); }

 private:
  detail::File file_;
};

class PosixReadableFile final : public ReadableFile {
 public:
  explicit PosixReadableFile(detail::File file) : file_(std::move(file)) {}
  const std::string& path() const override { return file_.path(); }
  int64_t size() const override { return file_.size(); }
  void read_at(void* data, int64_t length, int64_t offset) const override { file_.read_at(data, length, offset); }
  std::unique_ptr<MappedRegion> map(int64_t length) const override {
    return std::make_unique<detail::MappedFile>(file_, length);
  }

 private:
  detail::File file_;
};

detail::File open_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) util::throw_errno(fmt::format("cannot open directory '{}'", path), path, "open", errno);
  return detail::File(fd, path);
}

class PosixDirectoryLock final : public DirectoryLock {
 public:
  explicit PosixDirectoryLock(detail::File directory) : directory_(std::move(directory)) {}
  bool try_lock_exclusive() override {
    while (::flock(directory_.fd(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return false;
      if (errno != EINTR) fail();
    }
    return true;
  }
  void lock_shared() override {
    while (::flock(directory_.fd(), LOCK_SH) != 0) {
      if (errno != EINTR) fail();
    }
  }

 private:
  [[noreturn]] void fail() const {
    util::throw_errno(fmt::format("cannot lock '{}'", directory_.path()), directory_.path(), "lock", errno);
  }
  detail::File directory_;
};

// std::filesystem's error, as an IoError (or NotFound) of `operation` on `path`.
[[noreturn]] void throw_filesystem_error(const char* what, const std::string& path, const char* operation,
                                         const std::error_code& error) {
  util::throw_errno(fmt::format("{} '{}'", what, path), path, operation, error.value());
}

class PosixEnv final : public Env {
 public:
  std::unique_ptr<WritableFile> create_file(const std::string& path) override {
    return std::make_unique<PosixWritableFile>(detail::File::create(path));
  }
  std::unique_ptr<WritableFile> reuse_file(const std::string& from, const std::string& to) override {
    return detail::OverwrittenFile::open(from, to, kept_mappings_);
  }
  std::unique_ptr<ReadableFile> open_for_reading(const std::string& path) override {
    return std::make_unique<PosixReadableFile>(detail::File::open_for_reading(path));
  }
  FileType file_type(const std::string& path) override { return detail::file_type_at(path); }
  void rename_file(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      util::throw_errno(fmt::format("cannot rename '{}' to '{}'", from, to), to, "rename", errno);
    }
  }
  void remove_file(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) util::throw_errno(fmt::format("cannot remove '{}'", path), path, "unlink", errno);
    kept_mappings_.release_unlinked();
  }
  void remove_tree(const std::string& path) override {
    std::error_code error;
    std::filesystem::remove_all(path, error);
    kept_mappings_.release_unlinked();
    if (error) throw_filesystem_error("cannot remove", path, "unlink", error);
  }
  std::vector<std::string> list_directory(const std::string& path) override {
    DIR* directory = ::opendir(path.c_str());
    if (directory == nullptr) util::throw_errno(fmt::format("cannot list '{}'", path), path, "list", errno);
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* entry = ::readdir(directory)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int error = errno;
    ::closedir(directory);
    if (error != 0) util::throw_errno(fmt::format("cannot list '{}'", path), path, "list", error);
    return names;
  }
  void create_directories(const std::string& path) override {
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error) throw_filesystem_error("cannot create directory", path, "mkdir", error);
    // Following symbolic links: a checkpoint directory may be a link to one.
    if (!std::filesystem::is_directory(path, error)) {
      throw Error(fmt::format("'{}' exists and is not a directory", path));
    }
  }
  void sync_directory(const std::string& path) override { open_directory(path).sync(); }
  std::unique_ptr<DirectoryLock> lock_directory(const std::string& path) override {
    return std::make_unique<PosixDirectoryLock>(open_directory(path));
  }
  std::shared_ptr<ScratchFile> create_scratch_file(const std::string& dir, const std::string& stem,
                                                   int64_t bytes) override {
    return detail::PosixScratchFile::create(dir, stem, bytes);
  }
  std::unique_ptr<BatchIo> new_batch_io(BatchIoPath path) override { return detail::make_posix_batch_io(path); }

 private:
  detail::KeptMappings kept_mappings_;  // of the files reuse_file wrote over
};

}  // namespace

Env* Env::posix() {
  static Env* const env = new PosixEnv();  // never destroyed: usable from static destructors
  return env;
}

}  // namespace stowage::dcp
