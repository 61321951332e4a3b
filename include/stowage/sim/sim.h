#pragma once

// A simulated accelerator: LibTorch's PrivateUse1 device type, registered under the name
// "sim" (torch::Device("sim:0")), so that every device path of a program (streams, events,
// non-blocking copies, pinned host memory, the device generator, device memory
// accounting, out-of-memory errors) runs on a machine without one, the way a GPU would
// run it. It is stowage's own test device and is installed with it (target
// stowage::sim), in the manner of LevelDB's in-memory Env: users test their own training
// code's device paths with it.
//
// What a GPU does, the simulator does:
//  - Memory. Each device has a capacity; an allocation past it throws LibTorch's
//    c10::OutOfMemoryError naming the device, the requested and the free bytes. Device
//    memory is served by a c10::DeviceAllocator (getDeviceStats, resetPeakStats,
//    recordStream), as CUDA's caching allocator serves it.
//  - Asynchrony. Each stream is a queue drained by its own worker thread. A non-blocking
//    copy between pinned host memory and the device is queued on the current stream and
//    runs later, after a delay (random by default), or, while a CopyGate is closed, not
//    before something waits for it; a blocking copy, or one from pageable
//    host memory, has completed when it returns, as on CUDA. Events record, wait, query
//    and synchronize with CUDA's semantics. Compute runs on the calling thread, by each
//    op's CPU kernel on the device memory itself, after the work already queued on the
//    current stream: what a kernel writes, into its outputs or into arguments its schema
//    does not mark as written (batch norm's running statistics), and the views it
//    returns, are the device's, bit for bit what the CPU computes.
//  - Hazards. A freed block is poisoned (every byte 0xFF: NaN in floating point) and
//    reused only once the streams it was used on (its allocation stream and those named
//    by recordStream) have drained, so a missing record_stream or wait_stream shows as
//    wrong values. An op or copy that reads device memory an unfinished copy on another
//    stream is writing, or writes memory such a copy is reading, is a hazard: it throws
//    a SimHazardError naming the op and both streams (from a stream's worker, the error
//    is thrown by the next simulator call on the host).
//
// An argument an op's schema marks as written (Tensor(a!): out=, in-place) is computed on
// a CPU copy and copied back, so that the kernel can resize it: the simulator is for
// correctness and memory, and no time it takes is a device's time.
//
// Needs LibTorch 2.x (c10::register_privateuse1_backend, PrivateUse1HooksInterface,
// c10::DeviceAllocator): the target exists only in builds against one, and
// build_info().with_sim says whether this stowage has it.

#include <stowage/error.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::sim {

// An op or copy touched device memory that an unfinished copy on another stream was
// using. what() names the op, the device, and both streams.
class SimHazardError : public Error {
 public:
  using Error::Error;
};

struct SimOptions {
  // Number of devices, sim:0 .. sim:(devices - 1). Read once, by the first
  // register_device(); the environment variable STOWAGE_SIM_DEVICES overrides it.
  int devices = 2;
  // Bytes each device holds; STOWAGE_SIM_CAPACITY (e.g. "64MiB", "1GiB", "4096")
  // overrides it. set_capacity() changes it later.
  int64_t capacity_bytes = int64_t(16) << 30;
  // How long a queued copy waits on its stream's worker before it moves its bytes: a
  // random time in [min, max] microseconds, drawn per copy. 0 and 0 run each copy as
  // soon as its worker reaches it.
  int64_t copy_delay_min_us = 0;
  int64_t copy_delay_max_us = 200;
  // Whether the device has page-locked ("pinned") host memory. Without it, as on a device
  // whose runtime cannot pin, tensor.pin_memory() fails and every copy with the host has
  // completed when it returns. STOWAGE_SIM_PINNED_MEMORY=1 or =0 overrides it.
  bool pinned_memory = true;
};

// Registers the simulated device type under the name "sim", its allocators, guard,
// hooks, generator and operators. REQUIRES: no backward pass ran in this process yet
// (LibTorch's autograd engine counts the devices once, at its first backward), as with
// any PrivateUse1 device. Idempotent: later calls do nothing and their options
// are ignored. Throws InvalidArgument for an invalid option or environment variable
// (naming it and its value), Error when another PrivateUse1 device is registered.
void register_device(const SimOptions& options = {});

// REQUIRES: register_device() was called (the functions below throw otherwise).
c10::DeviceType device_type();  // c10::DeviceType::PrivateUse1
int device_count();
c10::Device device(int index = 0);  // throws InvalidArgument for an index not in [0, device_count())

// The capacity of sim:`index`, in bytes (> 0). Lowering it below what is allocated makes the next
// allocations fail, and frees nothing.
void set_capacity(int64_t bytes, int index = 0);
int64_t capacity(int index = 0);

// Changes the delay of copies queued from now on (see SimOptions).
void set_copy_delay(int64_t min_us, int64_t max_us);

// Holds the device's asynchronous copies pending, so that a test shows a missing
// synchronization whatever the machine's load: while the gate is closed, a non-blocking
// copy queued meanwhile does not start until something waits for it, that is, the host
// synchronizes its stream (or its device), or runs an op on its stream, or the host or
// another stream waits for an event recorded on its stream after it. A copy nothing waits
// for stays pending until the gate opens, however long the host takes; an op that uses
// its memory meanwhile is a hazard, and a free not ordered after it poisons what it reads.
// Nothing waits forever for a held copy: each wait releases what it waits for, and the
// destructor opens the gate. One gate at a time: the constructor throws Error while
// another is closed.
class CopyGate {
 public:
  CopyGate();
  ~CopyGate();
  CopyGate(const CopyGate&) = delete;
  CopyGate& operator=(const CopyGate&) = delete;

  // Lets every held copy run, and those queued from now on. Idempotent.
  void open();

 private:
  bool open_ = false;
};

// Parses a capacity: a positive number of bytes, optionally followed by KiB, MiB or GiB.
// Throws InvalidArgument naming `what` and the text.
int64_t parse_capacity(const std::string& text, const std::string& what);

// The hazards detected since the last clear_hazards(), oldest first, each as its
// SimHazardError's message. Thread-safe.
std::vector<std::string> hazards();
void clear_hazards();

// Blocks until every stream of every device has drained.
void synchronize_all();

}  // namespace stowage::sim
