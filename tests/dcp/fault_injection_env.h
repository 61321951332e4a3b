#pragma once

// An Env that counts the calls of each kind and fails the k-th one (the role of
// LevelDB's FaultInjectionTestEnv). Every other call goes to the real file system.
// The failure is what a real one would throw: an IoError of the call's operation on
// its path, with EIO or the errno asked for. It serves checkpoints and the swap
// optimizer's disk tier alike: a scratch file's creation is an open (of its directory), a
// batch's reads a read and its writes a write (of its first file), and a failed batch
// write first writes the first half of its first request, as a write that runs out of
// space part way does.

#include <stowage/dcp/env.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>

namespace stowage::dcp::testing {

enum class Call { kOpen, kWrite, kFsync, kRename, kUnlink, kMmap, kRead, kList, kMkdir, kLock, kStat };
constexpr std::array<Call, 11> kAllCalls = {Call::kOpen,   Call::kWrite, Call::kFsync, Call::kRename,
                                            Call::kUnlink, Call::kMmap,  Call::kRead,  Call::kList,
                                            Call::kMkdir,  Call::kLock,  Call::kStat};

// The operation an IoError of the call names.
inline const char* operation_of(Call call) {
  static constexpr std::array<const char*, kAllCalls.size()> names = {
      "open", "write", "fsync", "rename", "unlink", "mmap", "read", "list", "mkdir", "lock", "stat"};
  return names[static_cast<size_t>(call)];
}

class FaultInjectionEnv final : public EnvWrapper {
 public:
  explicit FaultInjectionEnv(Env* target = Env::posix()) : EnvWrapper(target) {}

  // From now on, counts every call anew and fails the k-th call of `call` (1-based), and
  // the `times` - 1 calls of that kind after it, with `error_number`; k 0 fails none.
  void fail(Call call, int64_t k, int error_number = EIO, int64_t times = 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_.fill(0);
    armed_ = call;
    armed_k_ = k;
    armed_times_ = times;
    armed_error_ = error_number;
    failed_path_.reset();
  }
  int64_t count(Call call) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_[static_cast<size_t>(call)];
  }
  // The path of the call that was failed, if one was.
  std::optional<std::string> failed_path() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failed_path_;
  }

  // Counts a call of `call` on `path`, and throws if it is one to fail.
  void enter(Call call, const std::string& path) {
    if (const int error = counted(call, path); error != 0) throw injected(call, path, error);
  }
  // Counts a call of `call` on `path`: the errno to fail it with, or 0.
  int counted(Call call, const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t n = ++counts_[static_cast<size_t>(call)];
    if (call != armed_ || armed_k_ == 0 || n < armed_k_ || n >= armed_k_ + armed_times_) return 0;
    failed_path_ = path;
    return armed_error_;
  }
  static IoError injected(Call call, const std::string& path, int error_number) {
    return IoError(
        fmt::format("injected fault: cannot {} '{}': {}", operation_of(call), path, std::strerror(error_number)), path,
        operation_of(call), error_number);
  }

  std::unique_ptr<WritableFile> create_file(const std::string& path) override;
  std::unique_ptr<ReadableFile> open_for_reading(const std::string& path) override;
  FileType file_type(const std::string& path) override {
    enter(Call::kStat, path);
    return EnvWrapper::file_type(path);
  }
  void rename_file(const std::string& from, const std::string& to) override {
    enter(Call::kRename, to);
    EnvWrapper::rename_file(from, to);
  }
  void remove_file(const std::string& path) override {
    enter(Call::kUnlink, path);
    EnvWrapper::remove_file(path);
  }
  void remove_tree(const std::string& path) override {
    enter(Call::kUnlink, path);
    EnvWrapper::remove_tree(path);
  }
  std::vector<std::string> list_directory(const std::string& path) override {
    enter(Call::kList, path);
    return EnvWrapper::list_directory(path);
  }
  void create_directories(const std::string& path) override {
    enter(Call::kMkdir, path);
    EnvWrapper::create_directories(path);
  }
  void sync_directory(const std::string& path) override {
    enter(Call::kFsync, path);
    EnvWrapper::sync_directory(path);
  }
  std::unique_ptr<DirectoryLock> lock_directory(const std::string& path) override;
  std::shared_ptr<ScratchFile> create_scratch_file(const std::string& dir, const std::string& stem,
                                                   int64_t bytes) override {
    enter(Call::kOpen, dir);
    return EnvWrapper::create_scratch_file(dir, stem, bytes);
  }
  std::unique_ptr<BatchIo> new_batch_io(BatchIoPath path) override;

 private:
  mutable std::mutex mutex_;
  std::array<int64_t, kAllCalls.size()> counts_{};
  Call armed_ = Call::kOpen;
  int64_t armed_k_ = 0;
  int64_t armed_times_ = 1;
  int armed_error_ = EIO;
  std::optional<std::string> failed_path_;
};

class FaultInjectionWritableFile final : public WritableFile {
 public:
  FaultInjectionWritableFile(FaultInjectionEnv& env, std::unique_ptr<WritableFile> file)
      : env_(env), file_(std::move(file)) {}
  const std::string& path() const override { return file_->path(); }
  void write_at(const void* data, int64_t length, int64_t offset) override {
    env_.enter(Call::kWrite, path());
    file_->write_at(data, length, offset);
  }
  void start_writeback(int64_t offset, int64_t length) override { file_->start_writeback(offset, length); }
  void sync() override {
    env_.enter(Call::kFsync, path());
    file_->sync();
  }
  void close() override { file_->close(); }

 private:
  FaultInjectionEnv& env_;
  std::unique_ptr<WritableFile> file_;
};

class FaultInjectionReadableFile final : public ReadableFile {
 public:
  FaultInjectionReadableFile(FaultInjectionEnv& env, std::unique_ptr<ReadableFile> file)
      : env_(env), file_(std::move(file)) {}
  const std::string& path() const override { return file_->path(); }
  int64_t size() const override { return file_->size(); }
  void read_at(void* data, int64_t length, int64_t offset) const override {
    env_.enter(Call::kRead, path());
    file_->read_at(data, length, offset);
  }
  std::unique_ptr<MappedRegion> map(int64_t length) const override {
    env_.enter(Call::kMmap, path());
    return file_->map(length);
  }

 private:
  FaultInjectionEnv& env_;
  std::unique_ptr<ReadableFile> file_;
};

class FaultInjectionDirectoryLock final : public DirectoryLock {
 public:
  FaultInjectionDirectoryLock(FaultInjectionEnv& env, std::string path, std::unique_ptr<DirectoryLock> lock)
      : env_(env), path_(std::move(path)), lock_(std::move(lock)) {}
  bool try_lock_exclusive() override {
    env_.enter(Call::kLock, path_);
    return lock_->try_lock_exclusive();
  }
  void lock_shared() override {
    env_.enter(Call::kLock, path_);
    lock_->lock_shared();
  }

 private:
  FaultInjectionEnv& env_;
  std::string path_;
  std::unique_ptr<DirectoryLock> lock_;
};

class FaultInjectionBatchIo final : public BatchIo {
 public:
  FaultInjectionBatchIo(FaultInjectionEnv& env, std::unique_ptr<BatchIo> io) : env_(env), io_(std::move(io)) {}
  BatchIoPath path() const override { return io_->path(); }
  void run(IoOp op, const std::vector<IoRequest>& requests) override {
    const Call call = op == IoOp::kRead ? Call::kRead : Call::kWrite;
    const std::string path = requests.empty() ? std::string() : requests.front().file->path();
    const int error = env_.counted(call, path);
    if (error == 0) {
      io_->run(op, requests);
      return;
    }
    if (op == IoOp::kWrite && !requests.empty()) {
      IoRequest half = requests.front();
      half.length = (half.length / 2 + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
      io_->run(op, {half});
    }
    throw FaultInjectionEnv::injected(call, path, error);
  }

 private:
  FaultInjectionEnv& env_;
  std::unique_ptr<BatchIo> io_;
};

inline std::unique_ptr<WritableFile> FaultInjectionEnv::create_file(const std::string& path) {
  enter(Call::kOpen, path);
  return std::make_unique<FaultInjectionWritableFile>(*this, EnvWrapper::create_file(path));
}

inline std::unique_ptr<ReadableFile> FaultInjectionEnv::open_for_reading(const std::string& path) {
  enter(Call::kOpen, path);
  return std::make_unique<FaultInjectionReadableFile>(*this, EnvWrapper::open_for_reading(path));
}

inline std::unique_ptr<DirectoryLock> FaultInjectionEnv::lock_directory(const std::string& path) {
  enter(Call::kOpen, path);
  return std::make_unique<FaultInjectionDirectoryLock>(*this, path, EnvWrapper::lock_directory(path));
}

inline std::unique_ptr<BatchIo> FaultInjectionEnv::new_batch_io(BatchIoPath path) {
  return std::make_unique<FaultInjectionBatchIo>(*this, EnvWrapper::new_batch_io(path));
}

}  // namespace stowage::dcp::testing
