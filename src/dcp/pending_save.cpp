#include "dcp/pending_save.h"
#include "dcp/rank_outcomes.h"

#include <stowage/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

namespace stowage::dcp {

void PendingSaveAccess::begin(const StorageWriter& writer, AsyncStager& stager,
                              const std::shared_future<Metadata>& upload) {
  if (stager.reuses_buffers()) stager.latest_save_ = upload;
  std::lock_guard<std::mutex> lock(writer.pending_mutex_);
  TORCH_INTERNAL_ASSERT(!writer.pending_save_.valid(), "async_save: a second save began on a writer before make_room");
  writer.pending_save_ = upload;
}

void PendingSaveAccess::finished(const StorageWriter& writer) {
  std::lock_guard<std::mutex> lock(writer.pending_mutex_);
  writer.pending_save_ = {};
}

void PendingSaveAccess::wait(const StorageWriter& writer) {
  std::shared_future<Metadata> save;
  {
    std::lock_guard<std::mutex> lock(writer.pending_mutex_);
    save = writer.pending_save_;
  }
  if (save.valid()) save.wait();
}

bool PendingSaveAccess::pending(const StorageWriter& writer) {
  std::lock_guard<std::mutex> lock(writer.pending_mutex_);
  return writer.pending_save_.valid();
}

bool has_pending_save(const StorageWriter& writer) {
  return PendingSaveAccess::pending(writer);
}

void PendingSaveAccess::make_room(const StorageWriter& writer, AsyncStager& stager, PendingSave policy,
                                  const std::optional<dist::ProcessGroup>& group) {
  std::string rejected;  // why this rank rejects, if it does
  if (policy == PendingSave::kReject) {
    if (pending(writer)) {
      rejected = "a save on its writer is still in flight (PendingSave::kReject)";
    } else if (stager.reuses_buffers() && stager_busy(stager)) {
      rejected =
          "a save of its stager's previous snapshot (whose buffers the stager reuses) is still in flight, "
          "possibly on another writer (PendingSave::kReject)";
    }
  }
  if (group) {
    std::vector<std::string> votes;
    try {
      votes = group->all_gather(rejected);
    } catch (...) {
      detail::rethrow_as_checkpoint_error("start", group->rank());
    }
    std::map<int64_t, RankFailure> rejecting;
    for (size_t r = 0; r < votes.size(); ++r) {
      if (!votes[r].empty()) rejecting[static_cast<int64_t>(r)] = detail::plain_failure(votes[r]);
    }
    if (!rejecting.empty()) throw DistributedCheckpointError("start", std::move(rejecting));
  } else if (!rejected.empty()) {
    throw Error(fmt::format("async_save: {}", rejected));
  }
  wait(writer);
  // Its errors are that save's to report, not this one's.
  if (stager.latest_save_.valid()) stager.latest_save_.wait();
  stager.latest_save_ = {};
}

}  // namespace stowage::dcp
