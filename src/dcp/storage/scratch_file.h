#pragma once

// Env::posix()'s ScratchFile (dcp/env.h): a buffered descriptor for the mapping and a second
// one, O_DIRECT where the file system allows it, for BatchIo's reads and writes.

#include <stowage/dcp/env.h>

#include <cstdint>
#include <memory>
#include <string>

namespace stowage::dcp::detail {

class PosixScratchFile final : public ScratchFile {
 public:
  static std::shared_ptr<PosixScratchFile> create(const std::string& dir, const std::string& stem, int64_t bytes);
  ~PosixScratchFile() override;
  PosixScratchFile(const PosixScratchFile&) = delete;
  PosixScratchFile& operator=(const PosixScratchFile&) = delete;

  const std::string& path() const override { return path_; }
  int64_t size() const override { return size_; }
  bool direct() const override { return direct_; }
  char* mapping() const override { return static_cast<char*>(mapping_); }
  // For BatchIo: O_DIRECT when direct(), else a dup of the buffered descriptor.
  int io_fd() const { return io_fd_; }

 private:
  PosixScratchFile() = default;

  std::string path_;
  int64_t size_ = 0;
  int fd_ = -1;  // buffered, for the mapping
  int io_fd_ = -1;
  bool direct_ = false;
  void* mapping_ = nullptr;
};

// The descriptor BatchIo reads and writes `file` through. Throws InvalidArgument if
// `file` is not Env::posix()'s.
int io_descriptor(const ScratchFile& file);

}  // namespace stowage::dcp::detail
