#include <stowage/error.h>
#include <stowage/memory/copy_engine.h>
#include <stowage/memory/skipped_sync.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace stowage::memory {

// Completion marker of a CPU lane. Set exactly once, by the lane's worker.
struct CopyEvent::Marker {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;  // of a copy that failed before the marker on its lane

  void complete(std::exception_ptr failure) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(failure);
    }
    done_cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    done_cv.wait(lock, [&] { return done; });
  }
  bool query() {
    std::lock_guard<std::mutex> lock(mutex);
    return done;
  }
};

bool CopyEvent::query() const {
  if (marker_) return marker_->query();
  if (device_event_) return device_event_->query();
  return true;
}

// ------------------------------------------------------------------------ lanes

class CopyEngine::Lane {
 public:
  Lane(CopyEnv* env, CopyLane which) : env_(env), which_(which) {}
  virtual ~Lane() = default;
  // Copy number `copy_number` of the lane, through the env.
  virtual void copy(int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) = 0;
  virtual CopyEvent record() = 0;
  virtual void wait(const CopyEvent& event) = 0;
  // An event after everything enqueued so far, carrying the lane's failure, which it clears.
  virtual CopyEvent clear_failure() = 0;

  std::atomic<int64_t> copies{0};
  std::atomic<int64_t> bytes{0};

 protected:
  void run_copy(int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) const {
    const c10::AutoGradMode no_grad(false);
    env_->copy(which_, copy_number, dst, src);
  }

 private:
  CopyEnv* env_;
  CopyLane which_;
};

// A worker thread running the lane's tasks in FIFO order. Invariant: while failure_ is
// set, copies are skipped and markers carry it.
class CopyEngine::ThreadLane final : public CopyEngine::Lane {
 public:
  ThreadLane(CopyEnv* env, CopyLane which) : Lane(env, which), worker_([this] { run(); }) {}

  ~ThreadLane() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queued_cv_.notify_one();
    worker_.join();  // the worker drains the queue before it exits
  }

  void copy(int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) override {
    enqueue([this, copy_number, dst = dst, src = src]() mutable {
      if (!failure_) {
        try {
          run_copy(copy_number, dst, src);
        } catch (...) {
          failure_ = std::current_exception();
        }
      }
      // Drop the references here, on the worker, once the copy has run.
      dst = at::Tensor();
      src = at::Tensor();
    });
  }

  CopyEvent record() override {
    CopyEvent event;
    event.marker_ = std::make_shared<CopyEvent::Marker>();
    enqueue([this, marker = event.marker_] { marker->complete(failure_); });
    return event;
  }

  void wait(const CopyEvent& event) override {
    if (!event.marker_) return;  // compute-side events on the CPU have already completed
    enqueue([this, marker = event.marker_] {
      marker->wait();
      if (marker->error && !failure_) failure_ = marker->error;
    });
  }

  CopyEvent clear_failure() override {
    CopyEvent event;
    event.marker_ = std::make_shared<CopyEvent::Marker>();
    enqueue([this, marker = event.marker_] {
      marker->complete(failure_);
      failure_ = nullptr;
    });
    return event;
  }

 private:
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    queued_cv_.notify_one();
  }

  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and nothing left to run
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable queued_cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::exception_ptr failure_;  // touched by the worker only
  std::thread worker_;          // last: starts once everything above exists
};

// A device stream from the device's pool. Copies are non-blocking; the device tensor of
// each copy is recorded on the stream so that the caching allocator does not reuse its
// memory before the copy has run.
class CopyEngine::StreamLane final : public CopyEngine::Lane {
 public:
  StreamLane(CopyEnv* env, CopyLane which, c10::Device device)
      : Lane(env, which),
        device_(device),
        guard_impl_(device.type()),
        stream_(guard_impl_.getStreamFromGlobalPool(device)) {}

  ~StreamLane() override { stream_.synchronize(); }

  void copy(int64_t copy_number, const at::Tensor& dst, const at::Tensor& src) override {
    const c10::StreamGuard on_lane(stream_);
    run_copy(copy_number, dst, src);
    const at::Tensor& on_device = dst.device() == device_ ? dst : src;
    if (!sync_skipped(SkippedSync::kRecordStream)) {
      guard_impl_.recordDataPtrOnStream(on_device.storage().data_ptr(), stream_);
    }
  }

  CopyEvent record() override {
    CopyEvent event;
    event.device_event_ = std::make_shared<c10::Event>(device_.type());
    event.device_event_->record(stream_);
    event.stream_ = stream_;
    return event;
  }

  void wait(const CopyEvent& event) override {
    if (event.device_event_) event.device_event_->block(stream_);
  }

  CopyEvent clear_failure() override { return record(); }  // failures were thrown by copy()

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_impl_;
  c10::Stream stream_;
};

// -------------------------------------------------------------------------- env

// On the CPU, the same dtype, shape and contiguous layout make a plain memmove:
// Tensor::copy_ would start an OpenMP team on the lane's worker thread, whose threads then
// compete for the cores with the compute thread's own team.
void CopyEnv::copy(CopyLane /*lane*/, int64_t /*copy_number*/, const at::Tensor& dst, const at::Tensor& src) {
  if (dst.is_cpu() && src.is_cpu()) {
    if (dst.scalar_type() == src.scalar_type() && dst.sizes() == src.sizes() && dst.is_contiguous() &&
        src.is_contiguous()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    } else {
      dst.copy_(src);
    }
  } else {
    dst.copy_(src, /*non_blocking=*/true);
  }
}

CopyEnv* CopyEnv::standard() {
  static CopyEnv* const env = new CopyEnv();
  return env;
}

// ----------------------------------------------------------------------- engine

CopyEngine::CopyEngine(c10::Device device, CopyEnv* env) : device_(device) {
  if (env == nullptr) throw InvalidArgument("CopyEngine: env is null");
  if (device.is_cpu()) {
    h2d_ = std::make_unique<ThreadLane>(env, CopyLane::kHostToDevice);
    d2h_ = std::make_unique<ThreadLane>(env, CopyLane::kDeviceToHost);
  } else {
    h2d_ = std::make_unique<StreamLane>(env, CopyLane::kHostToDevice, device);
    d2h_ = std::make_unique<StreamLane>(env, CopyLane::kDeviceToHost, device);
  }
}

CopyEngine::~CopyEngine() = default;

CopyEngine::Lane& CopyEngine::lane(CopyLane which) {
  return which == CopyLane::kHostToDevice ? *h2d_ : *d2h_;
}

void CopyEngine::copy(CopyLane which, const at::Tensor& dst, const at::Tensor& src) {
  const bool upload = which == CopyLane::kHostToDevice;
  const at::Tensor& host = upload ? src : dst;
  const at::Tensor& on_device = upload ? dst : src;
  const char* name = upload ? "host-to-device" : "device-to-host";
  if (!dst.defined() || !src.defined()) {
    throw InvalidArgument(fmt::format("CopyEngine: {} copy of an undefined tensor", name));
  }
  if (!host.is_cpu() || on_device.device() != device_) {
    throw InvalidArgument(fmt::format("CopyEngine on {}: a {} copy goes from {} to {}, got {} to {}", device_.str(),
                                      name, upload ? "cpu" : device_.str(), upload ? device_.str() : "cpu",
                                      src.device().str(), dst.device().str()));
  }
  if (dst.numel() != src.numel()) {
    throw InvalidArgument(fmt::format("CopyEngine: {} copy of {} elements into {}", name, src.numel(), dst.numel()));
  }
  Lane& target = lane(which);
  const int64_t copy_number = target.copies.fetch_add(1);
  target.bytes.fetch_add(dst.numel() * static_cast<int64_t>(dst.element_size()));
  target.copy(copy_number, dst, src);
}

CopyEvent CopyEngine::record(CopyLane which) {
  return lane(which).record();
}

void CopyEngine::wait(CopyLane which, const CopyEvent& event) {
  lane(which).wait(event);
}

CopyEvent CopyEngine::record_compute() {
  CopyEvent event;
  if (!device_.is_cpu()) {
    const c10::impl::VirtualGuardImpl guard_impl(device_.type());
    event.stream_ = guard_impl.getStream(device_);
    event.device_event_ = std::make_shared<c10::Event>(device_.type());
    event.device_event_->record(*event.stream_);
  }
  return event;  // on the CPU, the calling thread's work is already done
}

void CopyEngine::wait_compute(const CopyEvent& event) {
  if (event.device_event_) {
    const c10::impl::VirtualGuardImpl guard_impl(device_.type());
    event.device_event_->block(guard_impl.getStream(device_));
  } else {
    synchronize(event);
  }
}

void CopyEngine::synchronize(const CopyEvent& event) {
  if (event.marker_) {
    event.marker_->wait();
    if (event.marker_->error) std::rethrow_exception(event.marker_->error);
  } else if (event.device_event_) {
    // LibTorch 1.13's c10::Event cannot block the host; the stream it was recorded on can.
    event.stream_->synchronize();
  }
}

std::exception_ptr CopyEngine::drain() {
  // Both lanes' markers go in first: a lane that waits for the other's events meets them
  // before its own marker, so once both markers have completed nothing is left to run.
  const CopyEvent h2d_done = h2d_->clear_failure();
  const CopyEvent d2h_done = d2h_->clear_failure();
  std::exception_ptr first;
  for (const CopyEvent* done : {&h2d_done, &d2h_done}) {
    try {
      synchronize(*done);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  return first;
}

CopyStats CopyEngine::stats() const {
  return {h2d_->copies.load(), h2d_->bytes.load(), d2h_->copies.load(), d2h_->bytes.load()};
}

}  // namespace stowage::memory
