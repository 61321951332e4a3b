#pragma once

// The disk tier's reads and writes: io_uring (liburing) with several blocks in flight, or
// a pool of threads calling pread/pwrite where io_uring is not to be had. Either way one
// call moves a batch: every request is split into blocks, all of them run, and the call
// returns once none is in flight.

#include <stowage/optim/swap_config.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace stowage::optim::detail {

enum class IoOp { kRead, kWrite };

// `bytes` bytes of file `fd` at `offset`, from or into `data`. With an O_DIRECT descriptor,
// all three must be multiples of kDiskAlignmentBytes (swap_file.h).
struct IoRequest {
  int fd = -1;
  int64_t offset = 0;
  char* data = nullptr;
  int64_t bytes = 0;
  std::string file;  // its name, for messages
};

class SwapFileIo {
 public:
  // Blocks in flight per call (io_uring's queue depth, or the pool's thread count), and
  // their size; DeepSpeed's aio defaults.
  static constexpr int kQueueDepth = 8;
  static constexpr int64_t kBlockBytes = int64_t(1) << 20;

  virtual ~SwapFileIo() = default;
  // The path that runs (never kAuto).
  virtual SwapIoPath path() const = 0;
  // Runs every request. If any fails, the rest still run (or are skipped) and then a
  // stowage::IoError names the file, the operation and the errno; a read past the end of
  // a file fails with EIO.
  virtual void run(IoOp op, const std::vector<IoRequest>& requests) = 0;
};

// The stowage::IoError of a read or write of `bytes` at `offset` of `file` that failed
// with `error_number`.
[[noreturn]] void throw_io_error(IoOp op, const std::string& file, int64_t offset, int64_t bytes, int error_number);

// kAuto gives io_uring if the kernel sets a ring up, else threads. kIoUring throws
// stowage::IoError when the kernel refuses a ring.
std::unique_ptr<SwapFileIo> make_swap_file_io(SwapIoPath path);

}  // namespace stowage::optim::detail
