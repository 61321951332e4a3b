#pragma once

// The bookkeeping of async saves in flight: each writer's (one at a time) and each
// buffer-reusing stager's latest, so that a new save waits for them or is rejected
// (PendingSave) before it starts.

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>
#include <stowage/dist/process_group.h>

#include <chrono>
#include <future>
#include <mutex>
#include <optional>

namespace stowage::dcp {

// The async_saves in flight, each held by its writer (one at a time: StorageWriter's
// pending save) and, for a stager that reuses its buffers, by the stager. A save is in
// flight from begin() until its finished(), which it calls once it no longer uses the
// writer, just before it completes its upload future.
class PendingSaveAccess {
 public:
  // Makes room for a new save: waits for the pending one or rejects, per `policy`.
  // With a group the ranks decide together, on the caller's thread before anything
  // starts, so that no rank's background save waits for a rank that rejected: if any
  // rank would reject, every rank does, naming those with a save in flight. The same
  // holds for a stager that reuses its buffers (AsyncStager::reuses_buffers()): the save
  // writing its previous snapshot, on any writer, is waited for or rejected.
  static void make_room(const StorageWriter& writer, AsyncStager& stager, PendingSave policy,
                        const std::optional<dist::ProcessGroup>& group);
  static void begin(const StorageWriter& writer, AsyncStager& stager, const std::shared_future<Metadata>& upload);
  static void finished(const StorageWriter& writer);
  // Waits for the save in flight on `writer`, if any; its outcome is that save's.
  static void wait(const StorageWriter& writer);
  static bool pending(const StorageWriter& writer);

 private:
  static bool stager_busy(const AsyncStager& stager) {
    return stager.latest_save_.valid() &&
           stager.latest_save_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  }
};

}  // namespace stowage::dcp
