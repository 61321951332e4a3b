#pragma once

// The swap optimizer's step: one driver that updates the parameters batch by batch while
// the swapped states of the next batch are uploaded and those of the previous one are
// downloaded, over a transport that says how a batch's states travel (packed host ranges
// through two staging arenas, or one device tensor per state).

#include <stowage/memory/copy_engine.h>

#include "optim/swap_internal.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace stowage::optim::detail {

// Batch b is units [begin(b), end(b)).
class Batches {
 public:
  explicit Batches(const std::vector<int64_t>& sizes);
  int64_t count() const { return static_cast<int64_t>(first_unit_.size()) - 1; }
  size_t begin(int64_t b) const { return first_unit_[b]; }
  size_t end(int64_t b) const { return first_unit_[b + 1]; }
  // The batch that holds unit u (u < the number of units).
  int64_t batch_of(size_t u) const;

 private:
  std::vector<size_t> first_unit_;  // count() + 1 entries, from 0 to the number of units
};

// Whether `event` was recorded and every copy before it on its lane succeeded; blocks
// until they have run.
bool copies_succeeded(memory::CopyEngine& engine, const c10::optional<memory::CopyEvent>& event);

// How the swapped states of a batch reach the device and come back. Every copy goes
// through the copy engine the transport was made with; the driver records the events.
class SwapTransport {
 public:
  virtual ~SwapTransport() = default;
  // Enqueues batch b's swapped states onto the upload lane, into device memory of b's own.
  virtual void upload(int64_t b) = 0;
  // The device copy of a swapped state of unit u of batch b, from upload(b) to release(b).
  virtual at::Tensor device_state(int64_t b, size_t u, const StateTensor& tensor) = 0;
  // Enqueues batch b's device copies onto the download lane, back into their host layout.
  virtual void download(int64_t b) = 0;
  // Gives batch b's device memory up for batch b + 2 once `downloaded` (download(b)'s
  // event) has completed.
  virtual void release(int64_t b, const memory::CopyEvent& downloaded) = 0;
  // How many batches later than its download a batch is released. Memory that only the
  // lanes reuse can be released at once (0); memory the compute side frees needs the
  // compute side to wait for the download first, which, right after enqueuing it, would
  // hold the next batch's update back: such a transport releases a batch later (1).
  virtual int64_t release_delay() const = 0;
  // A device tensor with the contents of device_state(b, u, tensor) that outlives the
  // transport: where a state stays when its download failed twice.
  virtual at::Tensor keep_on_device(int64_t b, size_t u, const StateTensor& tensor) = 0;

  // Where the states' home is not the host memory the downloads land in (the disk
  // tier), their way on from there. The default is for a transport whose downloads
  // reach the home.
  //
  // Blocks until every batch downloaded so far is home; throws if one could not get there.
  virtual void finish() {}
  // After a failure: stops what the transport still has queued, waiting for what runs.
  virtual void abandon() {}
  // Whether batch b's downloaded states are home, and, blocking, getting them there once
  // the download has succeeded (after abandon()).
  virtual bool stored(int64_t) { return true; }
  virtual void store(int64_t) {}
};

// Each batch's swapped states of one dtype are one contiguous range of that dtype's
// buffer in `host_buffers`, moved with one copy per direction into a staging arena on
// `device`; batch b uses arena b % 2. Throws stowage::Error if a batch's range is not
// contiguous.
std::unique_ptr<SwapTransport> make_packed_transport(memory::CopyEngine& engine, const std::vector<Unit>& units,
                                                     const Batches& batches,
                                                     const std::map<c10::ScalarType, at::Tensor>& host_buffers,
                                                     c10::Device device);
// Each swapped state gets a device tensor of its own for the batch, with one copy per
// state per direction.
std::unique_ptr<SwapTransport> make_per_tensor_transport(memory::CopyEngine& engine, const std::vector<Unit>& units,
                                                         const Batches& batches, c10::Device device);

struct DiskTier;
// The disk tier's transport: batch b's states are read from the scratch files into host
// buffer b % buffer_count, one batch ahead of its upload (see SwapOptimizerConfig), moved
// to and from the device as the packed (one copy per dtype, two arenas) or per-tensor
// transport would, and written back from the buffer by the I/O thread once downloaded.
// Batch b's states of each dtype are one contiguous, kDiskAlignmentBytes-aligned range of
// that dtype's file; the batch must fit one buffer.
std::unique_ptr<SwapTransport> make_disk_transport(
    memory::CopyEngine& engine, const std::vector<Unit>& units, const Batches& batches,
    const std::map<c10::ScalarType, std::shared_ptr<dcp::ScratchFile>>& files, DiskTier& tier, c10::Device device,
    bool packed);

// Updates one unit, reading its swapped states through `swapped_state`.
using UnitUpdate =
    std::function<void(Unit& unit, const std::function<at::Tensor(const StateTensor& tensor)>& swapped_state)>;

// Runs `update` over every unit, batch after batch, with at most two batches' device copies
// alive: the update of batch b overlaps the download of b - 1 and the upload of b + 1.
// `host_ready` is the event after which the host layout may be uploaded; on return it is
// the event of the last download, which the compute side has waited for.
//
// On a failure the units before the failed one are updated and none after. Every batch
// with an updated unit whose download did not succeed is downloaded again and, if that
// fails too, its states stay on the device (their holders point there), so that every
// state matches its parameter. Then a stowage::Error is thrown that gives the cause and
// what happened.
void run_swap_pipeline(memory::CopyEngine& engine, SwapTransport& transport, std::vector<Unit>& units,
                       const Batches& batches, memory::CopyEvent& host_ready, const UnitUpdate& update);

}  // namespace stowage::optim::detail
