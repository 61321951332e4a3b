#pragma once

// The file-system calls of dcp's file-system storage, behind one seam (the role of
// LevelDB's Env). FileSystemWriter, FileSystemReader and CheckpointManager make every
// call to the file system through an Env; Env::posix() is the real one. A test
// replaces it to see every call and to fail any of them (tests/dcp/fault_injection_env.h
// fails the k-th call of a kind), which real file systems can only do for a few calls
// and only as root.
//
// Failure semantics, for every implementation: a call that fails throws IoError naming
// the path, the operation ("open", "create", "write", "fsync", "rename", "unlink",
// "mmap", "read", "mkdir", "list", "lock", "stat") and errno (NotFound, a kind of
// IoError, for ENOENT and ENOTDIR); a file shorter than a read
// needs throws CorruptionError; a call that fails changes nothing it was not asked to.
// An Env and the objects it returns may be used from several threads at once, each
// file by one thread at a time. The Env must outlive the writers, readers and managers
// that use it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stowage::dcp {

// A file being written, made by Env::create_file.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes the file if close() did not
  virtual const std::string& path() const = 0;
  virtual void write_at(const void* data, int64_t length, int64_t offset) = 0;
  // Starts writing the range back to the device without waiting for it: a hint that
  // lets sync() wait less (it may do nothing; sync() reports the failures).
  virtual void start_writeback(int64_t offset, int64_t length) = 0;
  virtual void sync() = 0;
  virtual void close() = 0;
};

// The first length() bytes of a file, mapped read-only. Pages of a file someone else
// truncates later raise SIGBUS when touched: read them only through the guarded reads
// of src/dcp/storage/mapped_file.h.
class MappedRegion {
 public:
  virtual ~MappedRegion() = default;
  virtual const char* data() const = 0;
  virtual int64_t length() const = 0;
};

// A regular file opened for reading, made by Env::open_for_reading.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual const std::string& path() const = 0;
  // Its size now.
  virtual int64_t size() const = 0;
  // CorruptionError ("short read") if the file ends first.
  virtual void read_at(void* data, int64_t length, int64_t offset) const = 0;
  // Maps the first `length` bytes, which the file must hold now (CorruptionError naming
  // it if it is shorter); length 0 maps nothing.
  virtual std::unique_ptr<MappedRegion> map(int64_t length) const = 0;
};

// An advisory lock on a directory (flock), held until destroyed.
class DirectoryLock {
 public:
  virtual ~DirectoryLock() = default;
  // Takes the lock exclusively if no one else holds it; false if someone does.
  virtual bool try_lock_exclusive() = 0;
  // Takes (or turns an exclusive lock into) a shared lock, waiting for it.
  virtual void lock_shared() = 0;
};

// What a path names, as lstat sees it (symbolic links are not followed).
enum class FileType { kAbsent, kRegular, kDirectory, kSymbolicLink, kFifo, kSocket, kCharacterDevice, kBlockDevice };

// "a directory", "a FIFO", ...: for messages.
const char* describe(FileType type);

class Env {
 public:
  virtual ~Env() = default;

  // The process's file system through POSIX calls; never destroyed.
  static Env* posix();

  // A new file (O_CREAT|O_EXCL: an existing one is never reused).
  virtual std::unique_ptr<WritableFile> create_file(const std::string& path) = 0;
  // Without following a symbolic link, and refusing anything but a regular file
  // ("'<path>' is a FIFO, not a regular file") without blocking on a FIFO or touching
  // a device.
  virtual std::unique_ptr<ReadableFile> open_for_reading(const std::string& path) = 0;
  virtual FileType file_type(const std::string& path) = 0;
  // Atomically replaces `to` if it exists.
  virtual void rename_file(const std::string& from, const std::string& to) = 0;
  virtual void remove_file(const std::string& path) = 0;
  // The directory and everything under it.
  virtual void remove_tree(const std::string& path) = 0;
  // The names in a directory, without "." and "..", in no particular order.
  virtual std::vector<std::string> list_directory(const std::string& path) = 0;
  // mkdir -p; Error naming `path` if it exists and is not a directory.
  virtual void create_directories(const std::string& path) = 0;
  // Makes the directory's entries (creations, renames, removals) durable.
  virtual void sync_directory(const std::string& path) = 0;
  virtual std::unique_ptr<DirectoryLock> lock_directory(const std::string& path) = 0;
};

// The type of options' env: TORCH_ARG spells its accessors `const T&`, which for a
// spelled-out `Env*` would mean a pointer to a const Env.
using EnvPointer = Env*;

// Forwards every call to another Env: a base for an Env that changes some of them.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  std::unique_ptr<WritableFile> create_file(const std::string& path) override;
  std::unique_ptr<ReadableFile> open_for_reading(const std::string& path) override;
  FileType file_type(const std::string& path) override;
  void rename_file(const std::string& from, const std::string& to) override;
  void remove_file(const std::string& path) override;
  void remove_tree(const std::string& path) override;
  std::vector<std::string> list_directory(const std::string& path) override;
  void create_directories(const std::string& path) override;
  void sync_directory(const std::string& path) override;
  std::unique_ptr<DirectoryLock> lock_directory(const std::string& path) override;

 private:
  Env* target_;
};

}  // namespace stowage::dcp
