#include "sim/stream_queue.h"

#include "sim/runtime.h"

#include <stowage/error.h>

#include <array>
#include <atomic>
#include <unordered_map>
#include <vector>

namespace stowage::sim::detail {

// ------------------------------------------------------------------- copy gate

namespace {

struct CopyGateState {
  std::mutex mutex;  // guards the two below and every StreamQueue's released_
  std::condition_variable changed_cv;
  uint64_t closed_generation = 0;  // 0: open
  uint64_t generations = 0;        // gates ever closed
};

CopyGateState& gate() {
  static auto* state = new CopyGateState();  // never destroyed: workers may outlive static destruction
  return *state;
}

uint64_t closed_gate_generation() {
  std::lock_guard<std::mutex> lock(gate().mutex);
  return gate().closed_generation;
}

}  // namespace

void close_copy_gate() {
  {
    std::lock_guard<std::mutex> lock(gate().mutex);
    if (gate().closed_generation != 0) {
      throw Error("sim: a CopyGate is closed already; open it before closing another");
    }
    gate().closed_generation = ++gate().generations;
  }
  gate().changed_cv.notify_all();
}

void open_copy_gate() noexcept {
  {
    std::lock_guard<std::mutex> lock(gate().mutex);
    gate().closed_generation = 0;
  }
  gate().changed_cv.notify_all();
}

// ---------------------------------------------------------------------- Marker

void Marker::set_source(StreamQueue* source, uint64_t position) {
  std::lock_guard<std::mutex> lock(mutex_);
  source_ = source;
  position_ = position;
}

void Marker::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    completed_at_ = std::chrono::steady_clock::now();
  }
  done_cv_.notify_all();
}

void Marker::wait() {
  StreamQueue* source = nullptr;
  uint64_t position = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    source = source_;
    position = position_;
  }
  if (source != nullptr) source->release_through(position);
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
}

bool Marker::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

std::chrono::steady_clock::time_point Marker::completed_at() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_at_;
}

// ----------------------------------------------------------------- StreamQueue

StreamQueue::~StreamQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  release_through(UINT64_MAX);  // a held copy must not keep the worker from its end
  changed_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

uint64_t StreamQueue::push(Task task) {
  uint64_t position = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
    position = ++queued_;
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
  }
  changed_cv_.notify_all();
  return position;
}

uint64_t StreamQueue::enqueue(std::function<void()> task) {
  return push(Task{std::move(task), 0});
}

void StreamQueue::enqueue_copy(std::function<void()> copy) {
  push(Task{std::move(copy), closed_gate_generation()});
}

void StreamQueue::release_through(uint64_t position) {
  {
    std::lock_guard<std::mutex> lock(gate().mutex);
    if (position <= released_) return;
    released_ = position;
  }
  gate().changed_cv.notify_all();
}

std::shared_ptr<Marker> StreamQueue::record() {
  auto marker = std::make_shared<Marker>();
  if (idle()) {
    marker->complete();
  } else {
    marker->set_source(this, enqueue([marker] { marker->complete(); }));
  }
  return marker;
}

void StreamQueue::wait_for(std::shared_ptr<Marker> marker) {
  if (marker->done()) return;
  enqueue([marker = std::move(marker)] { marker->wait(); });
}

bool StreamQueue::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.empty() && !running_task_;
}

void StreamQueue::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  // Each wake-up releases what was queued meanwhile too: it is waited for as well.
  while (!tasks_.empty() || running_task_) {
    release_through(queued_);
    changed_cv_.wait(lock);
  }
}

void StreamQueue::run() {
  for (;;) {
    Task task;
    uint64_t position = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping with nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      position = ++taken_;
      running_task_ = true;
    }
    if (task.gate != 0) {  // held while its gate is closed and nothing waits for it
      std::unique_lock<std::mutex> lock(gate().mutex);
      gate().changed_cv.wait(lock, [&] { return gate().closed_generation != task.gate || position <= released_; });
    }
    task.run();
    // What the task captured (a host tensor a copy keeps alive) goes before the stream
    // counts as idle: a caller that synchronized may count on it being released.
    task.run = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_task_ = false;
    }
    changed_cv_.notify_all();
  }
}

// --------------------------------------------------------------- stream tables

namespace {

struct DeviceStreams {
  std::mutex mutex;  // guards queues
  std::unordered_map<c10::StreamId, std::unique_ptr<StreamQueue>> queues;
  std::atomic<c10::StreamId> next_pool{0};
  std::atomic<c10::StreamId> next_new{kPoolStreams + 1};
};

// Never destroyed: streams may still be used during static destruction.
std::array<DeviceStreams, kMaxDevices>& tables() {
  static auto* streams = new std::array<DeviceStreams, kMaxDevices>();
  return *streams;
}

thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};  // per device; 0: the default stream

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, sim_device(device), id);
}

}  // namespace

StreamQueue& queue_of(const c10::Stream& stream) {
  check_index(stream.device_index());
  DeviceStreams& table = tables()[static_cast<size_t>(stream.device_index())];
  std::lock_guard<std::mutex> lock(table.mutex);
  auto& queue = table.queues[stream.id()];
  if (!queue) queue = std::make_unique<StreamQueue>(stream);
  return *queue;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_index(device);
  return make_stream(device, t_current_stream[static_cast<size_t>(device)]);
}

c10::Stream default_stream(c10::DeviceIndex device) {
  check_index(device);
  return make_stream(device, 0);
}

c10::Stream exchange_stream(const c10::Stream& stream) {
  const c10::Stream previous = current_stream(stream.device_index());
  t_current_stream[static_cast<size_t>(stream.device_index())] = stream.id();
  return previous;
}

c10::Stream pool_stream(c10::DeviceIndex device) {
  check_index(device);
  const c10::StreamId n = tables()[static_cast<size_t>(device)].next_pool.fetch_add(1);
  return make_stream(device, 1 + n % kPoolStreams);
}

c10::Stream new_stream(c10::DeviceIndex device) {
  check_index(device);
  return make_stream(device, tables()[static_cast<size_t>(device)].next_new.fetch_add(1));
}

void synchronize_device(c10::DeviceIndex device) {
  check_index(device);
  std::vector<StreamQueue*> queues;
  {
    DeviceStreams& table = tables()[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(table.mutex);
    for (auto& [id, queue] : table.queues) queues.push_back(queue.get());
  }
  for (StreamQueue* queue : queues) queue->synchronize();
}

}  // namespace stowage::sim::detail
