#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace stowage {

// Every error stowage raises derives from Error, so callers can catch the library's
// failures apart from LibTorch's own c10::Error. Messages name the culprit (a key, a
// file, a rank) and say what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something the function cannot handle (a malformed state dict, a
// mismatched shape, an invalid option). Nothing was modified.
class InvalidArgument : public Error {
 public:
  using Error::Error;
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

 private:
  std::string path_;
  std::string operation_;
  int error_number_;
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

 private:
  std::string entry_;
  std::string file_;
  int64_t offset_;
};

// An interface method that a subclass must provide was called on the base class.
class NotImplemented : public Error {
 public:
  using Error::Error;
};

}  // namespace stowage
