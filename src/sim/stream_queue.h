#pragma once

// The simulator's streams. Each is a FIFO of tasks drained by a worker thread of its own
// (started at its first task), so work queued on a stream runs later, in order, and
// concurrently with the host and with other streams: the asynchrony of a GPU.
//
// Stream ids per device: 0 is the default stream, 1..kPoolStreams the pool that
// getStreamFromGlobalPool hands out round robin, higher ids come from new_stream().
// Invariant: a marker recorded on a stream completes after every task queued before it.
//
// The copy gate (stowage::sim::CopyGate): a copy queued while it is closed waits, on its
// worker and before it starts, until something waits for it: the host synchronizing its
// stream, or anyone (the host, or another stream's worker) waiting for a marker recorded
// after it. So nothing waits forever for a held copy, and one nothing waits for stays
// pending until the gate opens, however long the host takes.

#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace stowage::sim::detail {

constexpr c10::StreamId kPoolStreams = 8;

class StreamQueue;

// A point in a stream's work: completes once the stream reaches it.
class Marker {
 public:
  // Where the marker stands: the `position`th task queued on `source`.
  void set_source(StreamQueue* source, uint64_t position);
  void complete();
  // Lets the copies before the marker pass the copy gate, then blocks until it completes.
  void wait();
  bool done();
  std::chrono::steady_clock::time_point completed_at();  // REQUIRES: done()

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point completed_at_;
  StreamQueue* source_ = nullptr;  // queues are never destroyed
  uint64_t position_ = 0;
};

class StreamQueue {
 public:
  explicit StreamQueue(c10::Stream stream) : stream_(stream) {}
  ~StreamQueue();
  StreamQueue(const StreamQueue&) = delete;
  StreamQueue& operator=(const StreamQueue&) = delete;

  c10::Stream stream() const { return stream_; }

  // Queues `task`; it must not throw. Returns its position (1 for the queue's first task).
  uint64_t enqueue(std::function<void()> task);
  // Queues a copy: like enqueue, but held by the copy gate if it is closed now.
  void enqueue_copy(std::function<void()> copy);
  // Lets the copies queued up to `position` pass a closed copy gate: something waits for them.
  void release_through(uint64_t position);
  // A marker after everything queued so far.
  std::shared_ptr<Marker> record();
  // Work queued from now on starts after `marker` completes.
  void wait_for(std::shared_ptr<Marker> marker);
  // True when nothing is queued or running.
  bool idle();
  // Lets what is queued pass the copy gate, then blocks until it has run.
  void synchronize();

 private:
  struct Task {
    std::function<void()> run;
    uint64_t gate = 0;  // the generation of the closed copy gate that holds it; 0: none
  };

  uint64_t push(Task task);
  void run();

  const c10::Stream stream_;
  std::mutex mutex_;  // guards the six below
  std::condition_variable changed_cv_;
  std::deque<Task> tasks_;
  uint64_t queued_ = 0;  // tasks ever queued: the position of the latest
  uint64_t taken_ = 0;   // tasks ever taken by the worker: the position of the running one
  bool running_task_ = false;
  bool stopping_ = false;
  std::thread worker_;     // started by the first enqueue
  uint64_t released_ = 0;  // guarded by the gate's mutex: copies up to here pass it
};

// Closes the copy gate: copies queued from now on are held (see above). Throws Error when
// it is closed already.
void close_copy_gate();
// Opens it: every held copy runs. Opening an open gate does nothing.
void open_copy_gate() noexcept;

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
