#pragma once

// Test seam: switches off one of the synchronizations stowage's device paths rely on, so
// that a test can show that the device it runs on (the simulated one of stowage/sim/sim.h,
// or a GPU) exposes the bug its absence would be. Never set outside tests; set it while
// no stowage work is running.

namespace stowage::memory {

enum class SkippedSync {
  kNone,
  // DefaultStager hands out staged bytes without waiting for its copy stream.
  kStagingWait,
  // CopyEngine does not record a copy's device tensor on its lane's stream, so the device
  // allocator may reuse the tensor's memory while the copy still runs.
  kRecordStream,
  // The swap optimizer updates a batch without waiting for the batch's upload.
  kUploadWait,
  // A checkpoint's offloaded inputs (CheckpointOptions::offload_inputs) are handed to its
  // recomputation without the compute stream waiting for their upload.
  kOffloadWait,
};

void skip_sync_for_testing(SkippedSync sync);
// Whether `sync` is the one skipped.
bool sync_skipped(SkippedSync sync);

}  // namespace stowage::memory
