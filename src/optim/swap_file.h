#pragma once

// A scratch file of the swap optimizer's disk tier: the swapped states of one dtype, laid
// out as the host tier's packed buffer of that dtype would be.
//
// The file is unlinked as soon as it is open, so it never outlives the process (a crash
// leaves nothing behind in the directory), and its blocks are allocated when it is
// created: a full disk shows up there, when the layout is built, rather than as a fault in
// the middle of a step, and stores through the mapping cannot hit a hole.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>

namespace stowage::optim::detail {

// File offsets and lengths the disk tier reads and writes are multiples of this, as
// O_DIRECT requires of every file system we know of.
inline constexpr int64_t kDiskAlignmentBytes = 4096;

class SwapFile {
 public:
  // A file of `bytes` (rounded up to kDiskAlignmentBytes) of zeros in `dir`. Throws
  // stowage::IoError naming the file and the call that failed (e.g. "allocate" with
  // ENOSPC for a full disk); nothing is left behind then.
  static std::shared_ptr<SwapFile> create(const std::string& dir, const std::string& stem, int64_t bytes);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // The path the file had before it was unlinked, for messages.
  const std::string& name() const { return name_; }
  int64_t size() const { return size_; }
  // For the step's reads and writes: opened with O_DIRECT where the file system allows
  // it (direct() says whether), so that they bypass the page cache.
  int io_fd() const { return io_fd_; }
  bool direct() const { return direct_; }

  // The whole file as a 1-D tensor of `dtype` over a shared mapping: reads come from the
  // file, stores reach it. The tensor keeps the file open and mapped.
  static at::Tensor map(const std::shared_ptr<SwapFile>& file, c10::ScalarType dtype);

 private:
  SwapFile() = default;

  std::string name_;
  int64_t size_ = 0;
  int fd_ = -1;     // buffered, for the mapping
  int io_fd_ = -1;  // O_DIRECT when direct_, else a dup of fd_
  bool direct_ = false;
  void* mapping_ = nullptr;
};

}  // namespace stowage::optim::detail
