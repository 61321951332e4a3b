#include <stowage/error.h>

#include "optim/disk_tier.h"
#include "optim/swap_pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace stowage::optim::detail {
namespace {

using dcp::IoOp;
using dcp::IoRequest;
using memory::CopyEvent;
using memory::CopyLane;

// One thread running the tier's reads and writes in the order they were queued, so that
// task k is done once `done() > k`. The first failure stops it: nothing queued after a
// failed write runs, in particular no read into the buffer the write had to empty.
class IoQueue {
 public:
  IoQueue() : thread_([this] { work(); }) {}
  ~IoQueue() {
    abandon();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // Queues `task`; returns its number.
  int64_t push(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    changed_.notify_all();
    return pushed_++;
  }

  // Blocks until task `number` is done; rethrows the failure that stopped the queue first.
  void wait(int64_t number) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ > number || failure_; });
    if (done_ <= number) std::rethrow_exception(failure_);
  }
  void wait_all() { wait(pushed_ - 1); }

  bool succeeded(int64_t number) {
    std::lock_guard<std::mutex> lock(mutex_);
    return number >= 0 && done_ > number;
  }

  // Drops what has not started and waits for what runs.
  void abandon() {
    std::unique_lock<std::mutex> lock(mutex_);
    tasks_.clear();
    changed_.wait(lock, [&] { return !running_; });
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || (!tasks_.empty() && !failure_); });
      if (stopping_) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      lock.unlock();
      std::exception_ptr failure;
      try {
        task();
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      running_ = false;
      if (failure) {
        failure_ = failure;
        tasks_.clear();
      } else {
        ++done_;
      }
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> tasks_;
  int64_t pushed_ = 0;
  int64_t done_ = 0;  // tasks that succeeded; all of them come before any failed one
  std::exception_ptr failure_;
  bool running_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members it uses are there
};

// Where one swapped state is in the files and in its batch's buffer.
struct Placement {
  c10::ScalarType dtype;
  int64_t file_byte;    // in its dtype's file
  int64_t buffer_byte;  // in the batch's buffer
};

// A run of states contiguous in their file and in the buffer: one request.
struct Run {
  c10::ScalarType dtype;
  int64_t file_byte;
  int64_t buffer_byte;
  int64_t bytes;  // kDiskAlignmentBytes-aligned
};

// A batch's states of one dtype fill buffer bytes [begin, end).
struct Region {
  int64_t begin = 0;
  int64_t end = 0;
};

struct BatchPlan {
  std::vector<Run> runs;
  std::map<c10::ScalarType, Region> regions;
  int64_t bytes = 0;  // of the buffer
};

int64_t state_bytes(const at::Tensor& state) {
  return state.numel() * static_cast<int64_t>(state.element_size());
}

// Lays out batch b's swapped states in its buffer: by dtype, in unit and slot order, each
// at an aligned offset, so that states adjacent in their file are adjacent in the buffer.
BatchPlan plan_batch(const std::vector<Unit>& units, const Batches& batches, int64_t b,
                     std::map<std::pair<size_t, int>, Placement>& placements) {
  std::map<c10::ScalarType, std::vector<std::pair<size_t, const StateTensor*>>> by_dtype;
  for (size_t u = batches.begin(b); u < batches.end(b); ++u) {
    for (const StateTensor& slot : units[u].state.tensors) {
      if (slot.swapped) by_dtype[slot.holder->scalar_type()].emplace_back(u, &slot);
    }
  }
  BatchPlan plan;
  for (const auto& [dtype, states] : by_dtype) {
    Region& region = plan.regions[dtype];
    region.begin = plan.bytes;
    int64_t next_file_byte = -1;
    for (const auto& [u, slot] : states) {
      const int64_t file_byte = host_offset(*slot) * static_cast<int64_t>(c10::elementSize(dtype));
      const int64_t bytes = align_up(state_bytes(*slot->holder), kDiskAlignmentBytes);
      if (file_byte == next_file_byte) {
        plan.runs.back().bytes += bytes;
      } else {
        plan.runs.push_back({dtype, file_byte, plan.bytes, bytes});
      }
      placements[{u, slot->slot}] = {dtype, file_byte, plan.bytes};
      plan.bytes += bytes;
      next_file_byte = file_byte + bytes;
    }
    region.end = plan.bytes;
  }
  return plan;
}

class DiskTransport final : public SwapTransport {
 public:
  DiskTransport(memory::CopyEngine& engine, const std::vector<Unit>& units, const Batches& batches,
                const std::map<c10::ScalarType, std::shared_ptr<dcp::ScratchFile>>& files, DiskTier& tier,
                c10::Device device, bool packed)
      : engine_(engine),
        units_(units),
        batches_(batches),
        files_(files),
        tier_(tier),
        device_(device),
        packed_(packed),
        downloaded_(batches.count()),
        read_task_(batches.count(), -1),
        write_task_(batches.count(), -1),
        staged_(batches.count()) {
    for (int64_t b = 0; b < batches.count(); ++b) {
      plans_.push_back(plan_batch(units, batches, b, placements_));
      if (plans_.back().bytes > tier.buffer_bytes) {
        throw Error(
            fmt::format("Swap optimizer disk tier: batch {} needs {} bytes of host buffer, more than the {} of "
                        "each buffer",
                        b, plans_.back().bytes, tier.buffer_bytes));
      }
    }
    if (packed_) lay_out_arenas();
    for (int64_t b = 0; b < std::min(batches.count(), tier.buffer_count); ++b) queue_read(b);
  }

  void upload(int64_t b) override {
    io_.wait(read_task_[b]);
    if (packed_) {
      engine_.wait(CopyLane::kHostToDevice, arena_free_[b % 2]);
      for (const auto& [dtype, region] : plans_[b].regions) {
        engine_.copy(CopyLane::kHostToDevice, arena_view(b, dtype), buffer_region(b, dtype));
      }
      return;
    }
    for_each_state(b, [&](size_t u, const StateTensor& slot) {
      staged_[b][{u, slot.slot}] = at::empty_like(*slot.holder, slot.holder->options().device(device_));
    });
    engine_.wait(CopyLane::kHostToDevice, engine_.record_compute());  // allocated on the compute side
    for_each_state(b, [&](size_t u, const StateTensor& slot) {
      engine_.copy(CopyLane::kHostToDevice, staged_[b].at({u, slot.slot}), buffer_state(b, u, slot));
    });
  }

  at::Tensor device_state(int64_t b, size_t u, const StateTensor& slot) override {
    if (!packed_) return staged_[b].at({u, slot.slot});
    const Placement& at = placements_.at({u, slot.slot});
    const int64_t element = static_cast<int64_t>(c10::elementSize(at.dtype));
    return arena_view(b, at.dtype)
        .narrow(0, (at.buffer_byte - plans_[b].regions.at(at.dtype).begin) / element, slot.holder->numel())
        .view(slot.holder->sizes());
  }

  void download(int64_t b) override {
    if (packed_) {
      for (const auto& [dtype, region] : plans_[b].regions) {
        engine_.copy(CopyLane::kDeviceToHost, buffer_region(b, dtype), arena_view(b, dtype));
      }
    } else {
      for_each_state(b, [&](size_t u, const StateTensor& slot) {
        engine_.copy(CopyLane::kDeviceToHost, buffer_state(b, u, slot), staged_[b].at({u, slot.slot}));
      });
    }
    downloaded_[b] = engine_.record(CopyLane::kDeviceToHost);
    if (abandoned_) return;  // recovery stores what it downloads itself
    write_task_[b] = io_.push([this, b] {
      engine_.synchronize(*downloaded_[b]);  // a failed download is not written
      transfer(IoOp::kWrite, b);
    });
    if (b + tier_.buffer_count < batches_.count()) queue_read(b + tier_.buffer_count);
  }

  void release(int64_t b, const CopyEvent& downloaded) override {
    if (packed_) {
      arena_free_[b % 2] = downloaded;
    } else {
      engine_.wait_compute(downloaded);  // a stream wait, or on the CPU a block
      staged_[b].clear();
    }
  }

  int64_t release_delay() const override { return packed_ ? 0 : 1; }

  at::Tensor keep_on_device(int64_t b, size_t u, const StateTensor& slot) override {
    // Once downloaded, the buffer holds the batch (nothing is read into it after a write
    // that did not succeed), while the arena may hold batch b + 2 already.
    if (copies_succeeded(engine_, downloaded_[b]))
      return buffer_state(b, u, slot).to(device_, /*non_blocking=*/false, /*copy=*/true);
    return packed_ ? device_state(b, u, slot).clone() : device_state(b, u, slot);
  }

  void finish() override { io_.wait_all(); }

  void abandon() override {
    abandoned_ = true;
    io_.abandon();
  }

  bool stored(int64_t b) override { return io_.succeeded(write_task_[b]); }

  void store(int64_t b) override { transfer(IoOp::kWrite, b); }

 private:
  void queue_read(int64_t b) {
    read_task_[b] = io_.push([this, b] { transfer(IoOp::kRead, b); });
  }

  // Batch b's reads or writes, on the I/O thread (or, in recovery, the caller's).
  void transfer(IoOp op, int64_t b) {
    std::vector<IoRequest> requests;
    for (const Run& run : plans_[b].runs) {
      requests.push_back({files_.at(run.dtype).get(), run.file_byte, buffer_bytes(b) + run.buffer_byte, run.bytes});
    }
    tier_.io->run(op, requests);
    int64_t& counter = op == IoOp::kRead ? tier_.stats.read_bytes : tier_.stats.written_bytes;
    counter += plans_[b].bytes;
  }

  char* buffer_bytes(int64_t b) const { return static_cast<char*>(tier_.buffers[b % tier_.buffer_count].data_ptr()); }

  at::Tensor buffer_region(int64_t b, c10::ScalarType dtype) const {
    const Region& region = plans_[b].regions.at(dtype);
    return tier_.buffers[b % tier_.buffer_count].narrow(0, region.begin, region.end - region.begin).view(dtype);
  }

  at::Tensor buffer_state(int64_t b, size_t u, const StateTensor& slot) const {
    const Placement& at = placements_.at({u, slot.slot});
    return tier_.buffers[b % tier_.buffer_count]
        .narrow(0, at.buffer_byte, state_bytes(*slot.holder))
        .view(at.dtype)
        .view(slot.holder->sizes());
  }

  // Each dtype's range, aligned, as large as the largest batch's region of that dtype.
  void lay_out_arenas() {
    std::map<c10::ScalarType, int64_t> largest;
    for (const BatchPlan& plan : plans_) {
      for (const auto& [dtype, region] : plan.regions) {
        largest[dtype] = std::max(largest[dtype], region.end - region.begin);
      }
    }
    int64_t arena_bytes = 0;
    for (const auto& [dtype, bytes] : largest) {
      arena_offset_[dtype] = arena_bytes;
      arena_bytes += bytes;  // aligned already
    }
    const int arena_count = batches_.count() > 1 ? 2 : 1;
    for (int a = 0; a < arena_count && arena_bytes > 0; ++a) {
      arenas_.push_back(at::empty({arena_bytes}, at::TensorOptions().dtype(at::kByte).device(device_)));
    }
    arena_free_.resize(arena_count);
  }

  at::Tensor arena_view(int64_t b, c10::ScalarType dtype) const {
    const Region& region = plans_[b].regions.at(dtype);
    return arenas_[b % 2].narrow(0, arena_offset_.at(dtype), region.end - region.begin).view(dtype);
  }

  template <typename Visit>
  void for_each_state(int64_t b, Visit visit) {
    for (size_t u = batches_.begin(b); u < batches_.end(b); ++u) {
      for (const StateTensor& slot : units_[u].state.tensors) {
        if (slot.swapped) visit(u, slot);
      }
    }
  }

  memory::CopyEngine& engine_;
  const std::vector<Unit>& units_;
  const Batches& batches_;
  const std::map<c10::ScalarType, std::shared_ptr<dcp::ScratchFile>>& files_;
  DiskTier& tier_;
  c10::Device device_;
  bool packed_;
  std::vector<BatchPlan> plans_;
  std::map<std::pair<size_t, int>, Placement> placements_;            // by unit and slot
  std::map<c10::ScalarType, int64_t> arena_offset_;                   // packed: bytes
  std::vector<at::Tensor> arenas_;                                    // packed
  std::vector<CopyEvent> arena_free_;                                 // packed, per arena: the last download out of it
  std::vector<c10::optional<CopyEvent>> downloaded_;                  // per batch, once enqueued
  std::vector<int64_t> read_task_;                                    // per batch: its read's number in io_, or -1
  std::vector<int64_t> write_task_;                                   // per batch: its write's number in io_, or -1
  std::vector<std::map<std::pair<size_t, int>, at::Tensor>> staged_;  // per tensor: device copies
  bool abandoned_ = false;
  IoQueue io_;  // last: its thread stops, before the rest goes, when the transport does
};

}  // namespace

std::unique_ptr<SwapTransport> make_disk_transport(
    memory::CopyEngine& engine, const std::vector<Unit>& units, const Batches& batches,
    const std::map<c10::ScalarType, std::shared_ptr<dcp::ScratchFile>>& files, DiskTier& tier, c10::Device device,
    bool packed) {
  return std::make_unique<DiskTransport>(engine, units, batches, files, tier, device, packed);
}

}  // namespace stowage::optim::detail
