#include "dcp/pending_save.h"
#include "dcp/rank_outcomes.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

namespace stowage::dcp {

StorageWriter::~StorageWriter() {
  wait_for_pending_save();
}

void StorageWriter::wait_for_pending_save() noexcept {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    thread = std::move(pending_thread_);
    pending_ = {};
  }
  if (thread.joinable()) thread.join();
}

bool StorageWriter::has_pending_save() const {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  return pending_.valid() && pending_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

void PendingSaveAccess::make_room(StorageWriter& writer, AsyncStager& stager, PendingSave policy,
                                  const std::optional<dist::ProcessGroup>& group) {
  std::string rejected;  // why this rank rejects, if it does
  if (policy == PendingSave::kReject) {
    if (writer.has_pending_save()) {
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
    if (!rejecting.empty()) throw CheckpointError("start", std::move(rejecting));
  } else if (!rejected.empty()) {
    throw Error(fmt::format("async_save: {}", rejected));
  }
  writer.wait_for_pending_save();
  // Its errors are that save's to report, not this one's.
  if (stager.latest_save_.valid()) stager.latest_save_.wait();
  stager.latest_save_ = {};
}

}  // namespace stowage::dcp
