#pragma once

// The simulator's streams. Each is a FIFO of tasks drained by a worker thread of its own
// (started at its first task), so work queued on a stream runs later, in order, and
// concurrently with the host and with other streams: the asynchrony of a GPU.
//
// Stream ids per device: 0 is the default stream, 1..kPoolStreams the pool that
// getStreamFromGlobalPool hands out round robin, higher ids come from new_stream().
// Invariant: a marker recorded on a stream completes after every task queued before it.

#include <c10/core/Stream.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace stowage::sim::detail {

constexpr c10::StreamId kPoolStreams = 8;

// A point in a stream's work: completes once the stream reaches it.
class Marker {
 public:
  void complete();
  void wait();
  bool done();
  std::chrono::steady_clock::time_point completed_at();  // REQUIRES: done()

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point completed_at_;
};

class StreamQueue {
 public:
  explicit StreamQueue(c10::Stream stream) : stream_(stream) {}
  ~StreamQueue();
  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  c10::Stream stream() const { return stream_; }

  // Queues `task`; it must not throw.
  void enqueue(std::function<void()> task);
  // A marker after everything queued so far.
  std::shared_ptr<Marker> record();
  // Work queued from now on starts after `marker` completes.
  void wait_for(std::shared_ptr<Marker> marker);
  // True when nothing is queued or running.
  bool idle();
  // Blocks until everything queued so far has run.
  void synchronize();

 private:
  void run();

  const c10::Stream stream_;
  std::mutex mutex_;  // guards the four below
  std::condition_variable changed_cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_task_ = false;
  bool stopping_ = false;
  std::thread worker_;  // started by the first enqueue
};

// The queue of `stream`, made on first use. REQUIRES: a sim stream of a valid device.
StreamQueue& queue_of(const c10::Stream& stream);

c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream default_stream(c10::DeviceIndex device);
// Makes `stream` current on its device for the calling thread; returns the previous one.
c10::Stream exchange_stream(const c10::Stream& stream);
c10::Stream pool_stream(c10::DeviceIndex device);
c10::Stream new_stream(c10::DeviceIndex device);

// Blocks until every stream of `device` has drained.
void synchronize_device(c10::DeviceIndex device);

}  // namespace stowage::sim::detail
