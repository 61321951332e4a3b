#pragma once

// Thin, checked POSIX file operations, which Env::posix() is made of, and the checked
// helpers the file-system storage builds on an Env. Every error names the file and says
// what failed.

#include <stowage/dcp/env.h>

#include <cstdint>
#include <string>

namespace stowage::dcp::detail {

// An owned file descriptor and the path it was opened by.
class File {
 public:
  File() = default;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  // O_CREAT|O_EXCL: never reuses an existing file.
  static File create(const std::string& path);
  // Read-only, refusing symbolic links and anything but a regular file ("'<path>' is a
  // FIFO, not a regular file") at once: never blocks on a FIFO nor opens a device.
  static File open_for_reading(const std::string& path);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_ >= 0; }

  void write_at(const void* data, int64_t length, int64_t offset) const;
  // Throws Error ("short read") if the file ends first.
  void read_at(void* data, int64_t length, int64_t offset) const;
  int64_t size() const;
  // Starts writing back the range's dirty pages without waiting for them (Linux; a
  // no-op elsewhere), so that the disk works while the writer fills the next range and
  // sync() has less left to wait for.
  void start_writeback(int64_t offset, int64_t length) const;
  void sync() const;
  void close();

 private:
  int fd_ = -1;
  std::string path_;
};

// What `path` names (lstat); kAbsent for ENOENT and ENOTDIR, IoError for any other
// failure.
FileType file_type_at(const std::string& path);

std::string join_path(const std::string& directory, const std::string& name);
bool file_exists(Env& env, const std::string& path);
// Throws Error naming `path` and what it is when it exists and is not a regular file
// (a directory, FIFO, socket, device node or symbolic link); returns if it is absent.
void refuse_special_file(Env& env, const std::string& path);
// The whole file; throws Error naming it if it cannot be read.
std::string read_text_file(Env& env, const std::string& path);
// 16 random hex digits.
std::string new_save_id();
// Whether `text` has `count` hex digits from `from` on.
bool is_hex(const std::string& text, size_t from, size_t count);
// A data file's name as FileSystemWriter makes them: "data-<save id>-r<rank>..." ending
// in ".data".
bool is_data_file_name(const std::string& name);

}  // namespace stowage::dcp::detail
