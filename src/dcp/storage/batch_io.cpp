#include "dcp/storage/batch_io.h"

#include "dcp/storage/scratch_file.h"
#include "util/errno_error.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <unistd.h>

namespace stowage::dcp::detail {
namespace {

// One block of a request: what is left of it to move.
struct Block {
  const IoRequest* request;
  int fd;          // the request's file's (io_descriptor)
  int64_t offset;  // in the file
  char* data;
  int64_t bytes;
};

std::vector<Block> split(const std::vector<IoRequest>& requests) {
  std::vector<Block> blocks;
  for (const IoRequest& request : requests) {
    const int fd = io_descriptor(*request.file);
    for (int64_t done = 0; done < request.length; done += BatchIo::kBlockBytes) {
      const int64_t bytes = std::min(BatchIo::kBlockBytes, request.length - done);
      blocks.push_back({&request, fd, request.offset + done, request.data + done, bytes});
    }
  }
  return blocks;
}

const char* operation_of(IoOp op) {
  return op == IoOp::kRead ? "read" : "write";
}

// The IoError of a read or write of `block` that failed with `error_number`.
[[noreturn]] void throw_io_error(IoOp op, const Block& block, int error_number) {
  const std::string& path = block.request->file->path();
  util::throw_errno(fmt::format("cannot {} {} bytes at offset {} of the scratch file '{}'", operation_of(op),
                                block.bytes, block.offset, path),
                    path, operation_of(op), error_number);
}

// The first failure of a call: its block and errno.
struct Failure {
  bool failed = false;
  Block block{};
  int error_number = 0;
  void record(const Block& at, int error) {
    if (failed) return;
    failed = true;
    block = at;
    error_number = error;
  }
};

// Moves what `result` (a byte count, or -errno) says is done off `block`; returns the
// errno of a failure, 0 otherwise. A read that finds the end of the file is EIO: the
// scratch files are allocated in full, so it means the file was cut short.
int advance(Block& block, int64_t result, IoOp op) {
  if (result < 0) return static_cast<int>(-result);
  if (result == 0) return op == IoOp::kRead ? EIO : ENOSPC;
  block.offset += result;
  block.data += result;
  block.bytes -= result;
  return 0;
}

class UringIo final : public BatchIo {
 public:
  explicit UringIo(io_uring ring) : ring_(ring) {}
  ~UringIo() override { io_uring_queue_exit(&ring_); }
  UringIo(const UringIo&) = delete;
  UringIo& operator=(const UringIo&) = delete;

  BatchIoPath path() const override { return BatchIoPath::kIoUring; }

  void run(IoOp op, const std::vector<IoRequest>& requests) override {
    std::vector<Block> blocks = split(requests);
    size_t next = 0;
    int in_flight = 0;
    Failure failure;
    // Prepared and not yet submitted counts too: the rest of a short transfer of the last
    // block in flight must still go out in this call.
    while (in_flight > 0 || io_uring_sq_ready(&ring_) > 0 || (next < blocks.size() && !failure.failed)) {
      // Prepared and not yet submitted: the rest of a short transfer, from the last turn.
      int prepared = static_cast<int>(io_uring_sq_ready(&ring_));
      for (; in_flight + prepared < kQueueDepth && next < blocks.size() && !failure.failed; ++prepared) {
        submit(op, blocks, next++);
      }
      if (prepared > 0) {
        const int submitted = io_uring_submit(&ring_);
        if (submitted < 0) {
          // The ring took none of them: what is prepared would go out with a later call, on
          // buffers that may be gone by then. Wait for what is in flight, then give up on
          // the ring for good.
          broken_ = true;
          failure.record(blocks[next - 1], -submitted);
          next = blocks.size();
        } else {
          in_flight += submitted;
        }
      }
      if (in_flight == 0) break;
      io_uring_cqe* cqe = nullptr;
      if (const int waited = io_uring_wait_cqe(&ring_, &cqe); waited < 0) {
        if (waited == -EINTR) continue;
        broken_ = true;  // the ring itself fails: what is in flight cannot be waited for
        throw_io_error(op, blocks.front(), -waited);
      }
      const uint64_t index = io_uring_cqe_get_data64(cqe);
      const int64_t result = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      if (const int error = advance(blocks[index], result, op); error != 0) {
        failure.record(blocks[index], error);
      } else if (blocks[index].bytes > 0 && !failure.failed) {
        submit(op, blocks, index);  // a short transfer: the rest of the block
      }
    }
    if (failure.failed) throw_io_error(op, failure.block, failure.error_number);
  }

 private:
  // Prepares blocks[index]; the caller submits.
  void submit(IoOp op, const std::vector<Block>& blocks, size_t index) {
    if (broken_) {
      util::throw_errno("the io_uring ring of a batch I/O failed earlier and is no longer used", "", "io_uring_submit",
                        EIO);
    }
    const Block& block = blocks[index];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (op == IoOp::kRead) {
      io_uring_prep_read(sqe, block.fd, block.data, static_cast<unsigned>(block.bytes), block.offset);
    } else {
      io_uring_prep_write(sqe, block.fd, block.data, static_cast<unsigned>(block.bytes), block.offset);
    }
    io_uring_sqe_set_data64(sqe, index);
  }

  io_uring ring_;
  bool broken_ = false;
};

class ThreadIo final : public BatchIo {
 public:
  ThreadIo() {
    for (int i = 0; i < kQueueDepth; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadIo() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }
  ThreadIo(const ThreadIo&) = delete;
  ThreadIo& operator=(const ThreadIo&) = delete;

  BatchIoPath path() const override { return BatchIoPath::kThreads; }

  void run(IoOp op, const std::vector<IoRequest>& requests) override {
    std::vector<Block> blocks = split(requests);
    std::unique_lock<std::mutex> lock(mutex_);
    op_ = op;
    failure_ = Failure();
    for (Block& block : blocks) queue_.push_back(&block);
    pending_ = blocks.size();
    wake_.notify_all();
    done_.wait(lock, [this] { return pending_ == 0; });
    if (failure_.failed) throw_io_error(op, failure_.block, failure_.error_number);
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      Block* block = queue_.front();
      queue_.pop_front();
      const IoOp op = op_;
      const bool skip = failure_.failed;  // the call fails anyway: the rest need not run
      lock.unlock();
      const int error = skip ? 0 : transfer(op, *block);
      lock.lock();
      if (error != 0) failure_.record(*block, error);
      if (--pending_ == 0) done_.notify_all();
    }
  }

  static int transfer(IoOp op, Block& block) {
    while (block.bytes > 0) {
      const ssize_t result = op == IoOp::kRead
                                 ? ::pread(block.fd, block.data, static_cast<size_t>(block.bytes), block.offset)
                                 : ::pwrite(block.fd, block.data, static_cast<size_t>(block.bytes), block.offset);
      if (result < 0 && errno == EINTR) continue;
      if (const int error = advance(block, result < 0 ? -errno : result, op); error != 0) return error;
    }
    return 0;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::deque<Block*> queue_;
  IoOp op_ = IoOp::kRead;
  size_t pending_ = 0;
  Failure failure_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<BatchIo> make_posix_batch_io(BatchIoPath path) {
  if (path != BatchIoPath::kThreads) {
    io_uring ring{};
    const int result = io_uring_queue_init(BatchIo::kQueueDepth, &ring, 0);
    if (result == 0) return std::make_unique<UringIo>(ring);
    if (path == BatchIoPath::kIoUring) {
      util::throw_errno("the kernel refused an io_uring ring (use BatchIoPath::kThreads or kAuto)", "",
                        "io_uring_queue_init", -result);
    }
  }
  return std::make_unique<ThreadIo>();
}

}  // namespace stowage::dcp::detail
