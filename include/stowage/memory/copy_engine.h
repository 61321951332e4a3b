#pragma once

// Asynchronous copies between host memory and a device, on two lanes, one per direction,
// so that uploads, downloads and the compute that runs meanwhile all overlap.
//
// Where the device has streams (CUDA and the like), each lane is a stream taken from the
// device's pool and events are device events; the compute side is the device's current
// stream. On the CPU, each lane is a worker thread draining a FIFO queue and events are
// completion markers; the compute side is the calling thread, whose work is done by the
// time it records an event.
//
// Invariants, on every device:
//  - copies on one lane run one after another, in the order they were enqueued;
//  - an event recorded on a lane completes once everything enqueued on that lane before it
//    has completed;
//  - after wait(lane, event), later work on `lane` starts only once `event` has completed;
//  - the engine keeps the tensors of a copy alive until the copy has run, and the device
//    allocator does not hand out a device tensor's memory again while a lane uses it.
//
// Failures. A copy that fails on a CPU lane (when it runs) fails its lane: the lane skips
// its later copies, and every event recorded on it afterwards carries the failure, which
// synchronize() rethrows. A lane that waits for an event carrying a failure fails too, so
// work that depends on a failed copy never runs on what it left behind. On a stream lane
// a copy that cannot be enqueued makes copy() throw. drain() waits for everything
// enqueued and clears the failures, after which the engine works as new.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <exception>
#include <memory>

namespace stowage::memory {

enum class CopyLane { kHostToDevice, kDeviceToHost };

// A point in a lane's (or the compute side's) work. A default-constructed event has
// already completed.
class CopyEvent {
 public:
  CopyEvent() = default;
  // True once everything before the event has completed. Does not block.
  bool query() const;

 private:
  friend class CopyEngine;
  struct Marker;  // CPU lanes
  std::shared_ptr<Marker> marker_;
  std::shared_ptr<c10::Event> device_event_;  // stream lanes
  c10::optional<c10::Stream> stream_;         // where device_event_ was recorded
};

struct CopyStats {
  int64_t h2d_copies = 0;
  int64_t h2d_bytes = 0;
  int64_t d2h_copies = 0;
  int64_t d2h_bytes = 0;
};

// The one call that moves a copy's bytes, behind a seam (the role dcp::Env plays for
// files): the engine runs every copy through its CopyEnv, on a CPU lane on the lane's
// worker, on a stream lane when it is enqueued with the lane's stream current. A test
// derives from CopyEnv to fail the k-th copy of a lane (tests/memory/copy_engine_test.cpp).
//
// Failure semantics: a copy() that throws fails that copy as a failed transfer would (the
// engine's failure rules above); it may have written part of `dst` first. An env may be
// called from both lanes at once and must outlive the engines that use it.
class CopyEnv {
 public:
  virtual ~CopyEnv() = default;

  // dst.copy_(src), asynchronous where the device allows it; never destroyed.
  static CopyEnv* standard();

  // `copy_number` counts the copies enqueued on `lane` since the engine was made, from 0.
  virtual void copy(CopyLane lane, int64_t copy_number, const at::Tensor& dst, const at::Tensor& src);
};

class CopyEngine {
 public:
  // REQUIRES: `env` outlives the engine.
  explicit CopyEngine(c10::Device device, CopyEnv* env = CopyEnv::standard());
  // Waits for every enqueued copy; a failure nobody observed is dropped.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  c10::Device device() const { return device_; }

  // Enqueues dst.copy_(src) on `lane`. The host side must be a CPU tensor and the device
  // side a tensor on device(); both must have the same number of elements (dtypes may
  // differ: the copy casts).
  void copy(CopyLane lane, const at::Tensor& dst, const at::Tensor& src);
  // An event that completes after everything enqueued on `lane` so far.
  CopyEvent record(CopyLane lane);
  // Work enqueued on `lane` from now on starts after `event`.
  void wait(CopyLane lane, const CopyEvent& event);

  // An event after the compute work issued so far.
  CopyEvent record_compute();
  // Compute work issued from now on starts after `event`. On a device with streams this is
  // a stream wait and the calling thread goes on; on the CPU the calling thread is the
  // compute side, so it blocks.
  void wait_compute(const CopyEvent& event);

  // Blocks the calling thread until `event` has completed. Rethrows the error of a failed
  // copy that ran before the event on its lane.
  void synchronize(const CopyEvent& event);

  // Blocks until everything enqueued on both lanes has run, then clears the lanes'
  // failures (events recorded from now on are clean). Returns the first failure it
  // cleared, or null.
  std::exception_ptr drain();

  // Copies enqueued since construction, per direction.
  CopyStats stats() const;

 private:
  class Lane;
  class ThreadLane;
  class StreamLane;
  Lane& lane(CopyLane lane);

  c10::Device device_;
  std::unique_ptr<Lane> h2d_;
  std::unique_ptr<Lane> d2h_;
};

}  // namespace stowage::memory
