#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace stowage {

// The kinds of failure stowage reports, listed once: each class below says its kind
// (Error::kind()), and a rank's failure reaches the other ranks as its kind and its
// class's fields (dcp::RankFailure). An error class of a module (e.g.
// dcp::DistributedCheckpointError) has the kind of the class it derives from.
enum class ErrorKind {
  kError,            // Error itself: any other failure
  kInvalidArgument,  // InvalidArgument
  kIo,               // IoError
  kNotFound,         // NotFound, a kind of IoError
  kCorruption,       // CorruptionError
  kNotImplemented,   // NotImplemented
  kUnresponsive,     // of no class: a rank that died or stopped answering (dcp::RankFailure)
};

// Every error stowage raises derives from Error, so callers can catch the library's
// failures apart from LibTorch's own c10::Error. Messages name the culprit (a key, a
// file, a rank) and say what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  virtual ErrorKind kind() const noexcept { return ErrorKind::kError; }
};

// A caller passed something the function cannot handle (a malformed state dict, a
// mismatched shape, an invalid option). Nothing was modified.
class InvalidArgument : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const noexcept override { return ErrorKind::kInvalidArgument; }
};

// A system call on a file failed: `path` (empty for a call on no file), the operation
// ("open", "create", "read", "write", "fsync", "stat", "rename", "lock", "mmap", ...)
// and the errno it set. The message says all three.
class IoError : public Error {
 public:
  IoError(const std::string& message, std::string path, std::string operation, int error_number)
      : Error(message), path_(std::move(path)), operation_(std::move(operation)), error_number_(error_number) {}
  const std::string& path() const { return path_; }
  const std::string& operation() const { return operation_; }
  int error_number() const { return error_number_; }
  ErrorKind kind() const noexcept override { return ErrorKind::kIo; }

 private:
  std::string path_;
  std::string operation_;
  int error_number_;
};

// An IoError for a file or directory that is not there (ENOENT, ENOTDIR): a directory
// that holds no checkpoint, a data file gone missing.
class NotFound : public IoError {
 public:
  using IoError::IoError;
  ErrorKind kind() const noexcept override { return ErrorKind::kNotFound; }
};

// Stored bytes are not what was written: a checksum mismatch, a truncated or missing
// data file, malformed metadata. `entry` is the checkpoint entry they belong to (empty
// for the metadata itself), `file` the file, `offset` the byte offset in it where that
// is known (-1 otherwise).
class CorruptionError : public Error {
 public:
  CorruptionError(const std::string& message, std::string entry, std::string file, int64_t offset = -1)
      : Error(message), entry_(std::move(entry)), file_(std::move(file)), offset_(offset) {}
  const std::string& entry() const { return entry_; }
  const std::string& file() const { return file_; }
  int64_t offset() const { return offset_; }
  ErrorKind kind() const noexcept override { return ErrorKind::kCorruption; }

 private:
  std::string entry_;
  std::string file_;
  int64_t offset_;
};

// An interface method that a subclass must provide was called on the base class.
class NotImplemented : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const noexcept override { return ErrorKind::kNotImplemented; }
};

}  // namespace stowage
