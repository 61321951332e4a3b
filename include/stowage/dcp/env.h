#pragma once

// The process's file calls, behind one seam (the role of LevelDB's Env): those of dcp's
// file-system storage (FileSystemWriter, FileSystemReader, CheckpointManager) and those of
// the swap optimizer's disk tier (its scratch files and their batched reads and writes,
// optim/swap_config.h). Env::posix() is the real one. A test replaces it to see every call
// and to fail any of them (tests/dcp/fault_injection_env.h fails the k-th call of a kind),
// which real file systems can only do for a few calls and only as root.
//
// Failure semantics, for every implementation: a call that fails throws IoError naming
// the path, the operation ("open", "create", "write", "fsync", "rename", "unlink",
// "mmap", "truncate", "read", "mkdir", "list", "lock", "stat", "allocate", "io_uring_queue_init",
// "io_uring_submit") and errno (NotFound, a kind of IoError, for ENOENT and ENOTDIR); a
// file shorter than a read needs throws CorruptionError (a scratch file's batch read, EIO);
// a call that fails changes nothing it was not asked to. An Env and the objects it returns
// may be used from several threads at once, each file (and each BatchIo) by one thread at
// a time. The Env must outlive the writers, readers, managers and optimizers that use it.

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

// A file of the process's own, made by Env::create_scratch_file: unlinked as soon as it is
// open, so nothing of it outlives the process (a crash leaves nothing in its directory);
// its blocks allocated when it is made, so a full disk shows then rather than as a fault
// in the middle of a write, and stores through its mapping cannot hit a hole.
class ScratchFile {
 public:
  virtual ~ScratchFile() = default;  // unmaps and closes it: its blocks are freed
  // The path it had before it was unlinked, for messages.
  virtual const std::string& path() const = 0;
  // A multiple of kDirectIoAlignment.
  virtual int64_t size() const = 0;
  // Whether BatchIo's reads and writes of it bypass the page cache (O_DIRECT, where the
  // file system allows it).
  virtual bool direct() const = 0;
  // The whole file, mapped shared: loads read the file, stores reach it.
  virtual char* mapping() const = 0;
};

// The offsets, lengths and buffers of a direct ScratchFile's BatchIo are multiples of this,
// as O_DIRECT requires of every file system we know of.
inline constexpr int64_t kDirectIoAlignment = 4096;

enum class IoOp { kRead, kWrite };

// `length` bytes at `offset` of `file`, from or into `data`.
struct IoRequest {
  ScratchFile* file = nullptr;
  int64_t offset = 0;
  char* data = nullptr;
  int64_t length = 0;
};

// How a BatchIo moves its blocks.
enum class BatchIoPath {
  kAuto,     // io_uring where the kernel allows it, else threads
  kIoUring,  // io_uring (liburing); making one fails if the kernel refuses a ring
  kThreads,  // a pool of threads calling pread/pwrite
};

// Reads or writes of scratch files a batch at a time, several blocks in flight: each
// request is split into blocks, all of them run, and run() returns once none is in flight.
class BatchIo {
 public:
  // Blocks in flight per call (io_uring's queue depth, or the pool's thread count), and
  // their size; DeepSpeed's aio defaults.
  static constexpr int kQueueDepth = 8;
  static constexpr int64_t kBlockBytes = int64_t(1) << 20;

  virtual ~BatchIo() = default;
  // The path that runs (never kAuto).
  virtual BatchIoPath path() const = 0;
  // REQUIRES: every request's file was made by the Env that made this BatchIo.
  // Runs every request. If any fails, the rest still run (or are skipped) and then an
  // IoError names the file, the operation and the errno; a read past the end of a file
  // fails with EIO.
  virtual void run(IoOp op, const std::vector<IoRequest>& requests) = 0;
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
  // Renames the regular file `from` to `to` and opens it to be written over in place:
  // the pages it has are reused rather than new ones allocated (on tmpfs, the memory
  // tier's file system, stores into them run about three times as fast as write() into
  // new ones); close() truncates it to the end of what was written. Its bytes that are
  // not written over stay as they were.
  virtual std::unique_ptr<WritableFile> reuse_file(const std::string& from, const std::string& to) = 0;
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
  // A ScratchFile of `bytes` (rounded up to kDirectIoAlignment, at least one block) of
  // zeros in `dir`, named after `stem` until it is unlinked. IoError naming the file and the
  // call that failed ("allocate" with ENOSPC for a full disk); nothing is left behind then.
  virtual std::shared_ptr<ScratchFile> create_scratch_file(const std::string& dir, const std::string& stem,
                                                           int64_t bytes) = 0;
  // kAuto gives io_uring if the kernel sets a ring up, else threads; kIoUring throws
  // IoError ("io_uring_queue_init") when the kernel refuses a ring.
  virtual std::unique_ptr<BatchIo> new_batch_io(BatchIoPath path) = 0;
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
  std::unique_ptr<WritableFile> reuse_file(const std::string& from, const std::string& to) override;
  std::unique_ptr<ReadableFile> open_for_reading(const std::string& path) override;
  FileType file_type(const std::string& path) override;
  void rename_file(const std::string& from, const std::string& to) override;
  void remove_file(const std::string& path) override;
  void remove_tree(const std::string& path) override;
  std::vector<std::string> list_directory(const std::string& path) override;
  void create_directories(const std::string& path) override;
  void sync_directory(const std::string& path) override;
  std::unique_ptr<DirectoryLock> lock_directory(const std::string& path) override;
  std::shared_ptr<ScratchFile> create_scratch_file(const std::string& dir, const std::string& stem,
                                                   int64_t bytes) override;
  std::unique_ptr<BatchIo> new_batch_io(BatchIoPath path) override;

 private:
  Env* target_;
};

}  // namespace stowage::dcp
