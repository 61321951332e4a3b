#pragma once

// Where checkpoints go and come from: the storage side of save and load, split into
// the planning steps of planner.h so that a distributed run can interleave
// collectives between them.

#include <stowage/dcp/metadata.h>
#include <stowage/dcp/planner.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp {

// The storage of a save: an interface. An async_save's background work is owned by its
// response (AsyncSaveResponse), not by the writer, so a subclass has nothing to wait for;
// the writer must outlive the responses of the saves it serves. The writer keeps a handle
// on the async_save in flight on it, so that the next one waits or is rejected
// (PendingSave); subclasses never see it.
class StorageWriter {
 public:
  StorageWriter() = default;
  StorageWriter(const StorageWriter&) = delete;
  StorageWriter& operator=(const StorageWriter&) = delete;
  virtual ~StorageWriter() = default;

  // Every rank, first: prepares the destination and may amend the local plan.
  virtual SavePlan prepare_local_plan(SavePlan plan) = 0;
  // Coordinator: may amend every rank's plan (e.g. name each rank's files).
  virtual std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans, const Metadata& metadata) = 0;
  // Every rank: writes the tensor items of its final plan. data[item.data_index] holds
  // each item's tensor; the writer drops that reference once the bytes are written,
  // so that buffers nobody else holds are freed as the save progresses.
  virtual std::vector<WriteResult> write_data(const SavePlan& plan, std::vector<c10::IValue>& data) = 0;
  // Coordinator, after every rank wrote: makes the checkpoint visible, atomically.
  virtual void finish(const Metadata& metadata) = 0;
  // Every rank, after a failure anywhere: removes what this save wrote. Never throws.
  virtual void abort() noexcept = 0;

 private:
  friend class PendingSaveAccess;
  // The upload of the async_save in flight on this writer (one at a time), from its
  // start until it no longer uses the writer; invalid when none is. Guarded by the mutex.
  mutable std::mutex pending_mutex_;
  mutable std::shared_future<Metadata> pending_save_;
};

// A saved chunk, or a box of it, to read, and the contiguous CPU buffer it goes to: the
// elements read in row-major order.
struct ChunkRead {
  const EntryMetadata* entry = nullptr;
  const TensorChunk* chunk = nullptr;
  at::Tensor buffer;
  // The box to read, its offsets relative to the chunk (as in ReadItem); none: all of it.
  std::optional<ChunkBox> region;
  // Set by the reader once it has checked the bytes to read against their checksums
  // (StorageReader::verify_data); read_data then only copies them.
  bool verified = false;
};

class StorageReader {
 public:
  virtual ~StorageReader() = default;
  // The committed checkpoint's metadata; the reader then holds on to that checkpoint
  // (its data stays readable even if a writer replaces it) until the next call.
  virtual Metadata read_metadata() = 0;
  // Fills every buffer with verified bytes: everything it reads is checked against the
  // chunk's checksum or its block checksums. Throws Error naming the entry and the
  // file for a missing, short or corrupt chunk.
  virtual void read_data(std::vector<ChunkRead>& reads) = 0;
  // Checks every read as read_data() would, filling no buffer, and marks them verified;
  // throws like read_data(). load() then lets read_data() copy the bytes straight into
  // the caller's tensors, once every read has passed, instead of reading everything
  // into buffers of its own first. Only data files that change in place between the
  // two calls (stowage never rewrites one) escape the check. A reader that cannot check
  // without reading returns false and marks nothing (the default).
  virtual bool verify_data(std::vector<ChunkRead>& /*reads*/) { return false; }
};

}  // namespace stowage::dcp
