// save and async_save: one process, or the ranks of a group in step (rank_outcomes.h).
#include "dcp/copy_before_return.h"
#include "dcp/format/plan_codec.h"
#include "dcp/pending_save.h"
#include "dcp/rank_outcomes.h"
#include "dcp/staging_waves.h"
#include "dcp/storage/file_io.h"
#include "util/intra_op_threads.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/saveable_state.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace stowage::dcp {

namespace {

// What a rank saves: its plan and the leaves the plan indexes (the writer releases
// them as it writes). With waves, the leaves are the source's, staged wave by wave as
// they are written.
struct LocalSave {
  SavePlan plan;
  std::vector<c10::IValue> data;
  std::shared_ptr<detail::StagingWaves> waves;
};

std::vector<WriteResult> write_local(StorageWriter& writer, const SavePlan& plan, LocalSave& local) {
  return local.waves ? local.waves->write(writer, plan, local.data) : writer.write_data(plan, local.data);
}

// Plans `state`. Callers pass a temporary, gone once the plan is made: buffers that
// nobody but the plan's data holds (an uncached stager's snapshot) are freed as they
// are written.
LocalSave plan_local_save(const SaveableState& state, int64_t rank) {
  LocalSave local{create_local_save_plan(state, rank), {}, nullptr};
  local.data.reserve(state.leaves().size());
  for (const FlatEntry& entry : state.leaves().entries()) local.data.push_back(entry.value);
  return local;
}

// The save steps of one process, which is rank 0 and the coordinator.
Metadata run_local_save(LocalSave local, StorageWriter& writer) {
  try {
    std::vector<SavePlan> local_plans;
    local_plans.push_back(writer.prepare_local_plan(std::move(local.plan)));
    GlobalSavePlan global = create_global_save_plan(std::move(local_plans));
    global.metadata.save_id = detail::new_save_id();
    std::vector<SavePlan> final_plans = writer.prepare_global_plan(std::move(global.plans), global.metadata);
    std::vector<std::vector<WriteResult>> results;
    results.push_back(write_local(writer, final_plans.at(0), local));
    record_write_results(global.metadata, results);
    writer.finish(global.metadata);
    return global.metadata;
  } catch (...) {
    writer.abort();
    throw;
  }
}

// The coordinator's plan step: each rank's final plan (and the replicated boxes it
// holds), or every rank's failures; `metadata` gets the global plan's.
std::vector<detail::Verdict> decide_plans(const std::vector<detail::RankOutcome>& gathered, StorageWriter& writer,
                                          int64_t rank, int64_t ranks, Metadata& metadata) {
  std::vector<std::string> encoded;
  std::map<int64_t, RankFailure> failures = detail::failures_of(gathered, &encoded);
  std::vector<detail::Verdict> verdicts;
  if (failures.empty()) {
    try {
      std::vector<SavePlan> plans;
      plans.reserve(encoded.size());
      for (const std::string& plan : encoded) plans.push_back(detail::decode_save_plan(plan));
      GlobalSavePlan global = create_global_save_plan(std::move(plans));
      global.metadata.save_id = detail::new_save_id();
      const std::vector<SavePlan> final_plans = writer.prepare_global_plan(std::move(global.plans), global.metadata);
      for (size_t r = 0; r < final_plans.size(); ++r) {
        verdicts.push_back({detail::encode_assignment(final_plans[r], global.replicas.at(r)), {}});
      }
      metadata = std::move(global.metadata);
    } catch (...) {
      failures[rank] = detail::failure_in_flight("coordinator: ");
    }
  }
  if (!failures.empty()) verdicts.assign(ranks, detail::Verdict{"", failures});
  return verdicts;
}

// The coordinator's commit step: checks that the replicated boxes' copies agree, records
// where every chunk went and commits `metadata`; or the failures of the plan or the writes.
detail::Verdict decide_commit(const std::vector<detail::RankOutcome>& gathered, const detail::Verdict& plan,
                              Metadata& metadata, StorageWriter& writer, int64_t rank) {
  if (!plan.failures.empty()) return plan;
  std::vector<std::string> encoded;
  detail::Verdict verdict;
  verdict.failures = detail::failures_of(gathered, &encoded);
  if (!verdict.failures.empty()) return verdict;
  try {
    std::vector<std::vector<WriteResult>> results;
    std::vector<std::vector<ReplicaHash>> replica_hashes;
    results.reserve(encoded.size());
    replica_hashes.reserve(encoded.size());
    for (const std::string& bytes : encoded) {
      detail::RankWrites writes = detail::decode_writes(bytes);
      results.push_back(std::move(writes.results));
      replica_hashes.push_back(std::move(writes.replica_hashes));
    }
    check_replicas_agree(replica_hashes);
    record_write_results(metadata, results);
    writer.finish(metadata);
    verdict.payload = encode_metadata(metadata);
  } catch (...) {
    verdict.failures[rank] = detail::failure_in_flight("coordinator: ");
  }
  return verdict;
}

// The save steps of one rank of `group`. `prepare` makes the rank's local save; its
// errors count as the rank's failure in the plan step.
Metadata run_distributed_save(const std::function<LocalSave()>& prepare, StorageWriter& writer,
                              const dist::ProcessGroup& group) {
  constexpr int64_t kCoordinator = 0;
  const int64_t rank = group.rank();
  const bool coordinator = rank == kCoordinator;
  // Once a rank's results are gathered the coordinator may commit its files: if the
  // verdict then never arrives, they stay (unreferenced, like a crash's, if it did not).
  bool verdict_pending = false;
  const char* step = "plan";  // for a collective's failure
  try {
    // Plan: every rank plans; the coordinator decides and hands each rank its part.
    LocalSave local;
    const detail::RankOutcome planned = detail::attempt([&] {
      local = prepare();
      local.plan.rank = rank;
      return detail::encode_save_plan(writer.prepare_local_plan(std::move(local.plan)));
    });
    const std::vector<detail::RankOutcome> gathered_plans = detail::gather_outcomes(group, planned, kCoordinator);
    Metadata metadata;
    const std::vector<detail::Verdict> plan_verdicts =
        coordinator ? decide_plans(gathered_plans, writer, rank, group.size(), metadata)
                    : std::vector<detail::Verdict>{};
    const detail::Verdict my_plan = detail::scatter_verdicts(group, plan_verdicts, kCoordinator);
    step = "write";

    // Write: every rank hashes its copies of replicated boxes (before the writer drops
    // them) and writes its part, unless planning failed anywhere.
    const bool plan_failed = !my_plan.failures.empty();
    const detail::RankOutcome written =
        plan_failed ? detail::RankOutcome{"", detail::plain_failure("nothing written: planning failed")}
                    : detail::attempt([&] {
                        const detail::RankAssignment mine = detail::decode_assignment(my_plan.payload);
                        const std::vector<ReplicaHash> hashes = hash_replicas(mine.replicas, local.data, rank);
                        return detail::encode_writes(write_local(writer, mine.plan, local), hashes);
                      });
    const std::vector<detail::RankOutcome> gathered_results = detail::gather_outcomes(group, written, kCoordinator);
    verdict_pending = true;
    step = "commit";

    // Commit: the coordinator checks that the replicated boxes' copies agree, records
    // where every chunk went and commits.
    const detail::Verdict commit_verdict =
        coordinator ? decide_commit(gathered_results, my_plan, metadata, writer, rank) : detail::Verdict{};
    const detail::Verdict committed = detail::broadcast_verdict(group, commit_verdict, kCoordinator);
    verdict_pending = false;
    if (plan_failed) detail::accept(my_plan, "plan");
    const std::string text = detail::accept(committed, "write");
    if (coordinator) return metadata;
    return decode_metadata(text, fmt::format("from rank {}", kCoordinator));
  } catch (...) {
    if (!verdict_pending) writer.abort();
    detail::rethrow_as_checkpoint_error(step, rank);
  }
}

Metadata run_save(const std::function<LocalSave()>& prepare, StorageWriter& writer,
                  const std::optional<dist::ProcessGroup>& group) {
  if (group) return run_distributed_save(prepare, writer, *group);
  return run_local_save(prepare(), writer);
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer, std::optional<dist::ProcessGroup> group) {
  PendingSaveAccess::wait(writer);
  const int64_t rank = group ? group->rank() : 0;
  return run_save([&] { return plan_local_save(SaveableState(state), rank); }, writer, group);
}

namespace {

// Stands in for a writer that could not be made, so that this rank still runs every
// collective of the save: its first step fails with the error.
class UnavailableWriter final : public StorageWriter {
 public:
  // NOLINTNEXTLINE(bugprone-throw-keyword-missing): an exception_ptr is no exception to throw (clang-tidy 14 errs)
  explicit UnavailableWriter(std::exception_ptr error) : error_(std::move(error)) {}
  SavePlan prepare_local_plan(SavePlan) override { std::rethrow_exception(error_); }
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan>, const Metadata&) override {
    std::rethrow_exception(error_);
  }
  std::vector<WriteResult> write_data(const SavePlan&, std::vector<c10::IValue>&) override {
    std::rethrow_exception(error_);
  }
  void finish(const Metadata&) override { std::rethrow_exception(error_); }
  void abort() noexcept override {}

 private:
  std::exception_ptr error_;
};

}  // namespace

Metadata save(const StateDict& state, const std::string& checkpoint_dir, std::optional<dist::ProcessGroup> group) {
  std::optional<FileSystemWriter> writer;
  try {
    writer.emplace(checkpoint_dir);
  } catch (...) {
    if (!group) throw;
    UnavailableWriter unavailable(std::current_exception());
    return save(state, unavailable, std::move(group));
  }
  return save(state, *writer, std::move(group));
}

namespace {

// Where a group's background saves run: a group of the same ranks of their own, so that
// their collectives never interleave with the caller's, and the completion of the save
// started last, which the next one waits for before its first collective. Taking turns
// on the caller's thread runs the saves in the order the ranks started them, the same on
// every rank.
struct AsyncSaveLane {
  explicit AsyncSaveLane(dist::ProcessGroup save_group) : group(std::move(save_group)) {}

  // Records `done` as the last save's completion; returns the one before it (invalid
  // if none).
  std::shared_future<void> take_turn(std::shared_future<void> done) {
    std::lock_guard<std::mutex> lock(mutex);
    return std::exchange(last_turn, std::move(done));
  }

  const dist::ProcessGroup group;
  std::mutex mutex;  // guards last_turn
  std::shared_future<void> last_turn;
};

// The lane of `group`, made on its first async_save (collective: new_group).
std::shared_ptr<AsyncSaveLane> async_save_lane(const dist::ProcessGroup& group) {
  return std::static_pointer_cast<AsyncSaveLane>(group.attachment(
      "dcp.async_save", [&group] { return std::make_shared<AsyncSaveLane>(group.new_group("async_save")); }));
}

}  // namespace

namespace {

// The other ends of an async_save's futures.
struct AsyncSavePromises {
  std::promise<void> staging;
  std::promise<Metadata> upload;
};

// What the caller's thread hands the background save: the snapshot (taken, or its
// future while the stager stages in the background), or the error that stopped it.
// With a staging budget, the waves and, as `snapshot`, the source they stage.
struct StagingOutcome {
  std::optional<std::shared_future<SaveableState>> background;
  SaveableState snapshot;
  std::shared_ptr<detail::StagingWaves> waves;
  std::exception_ptr error;
};

// Makes the state a save writes and starts staging it. With `keep_error` (a group) an
// error is kept rather than thrown: it must still reach the other ranks through the
// background save's collectives.
StagingOutcome start_staging(const StateDict& state, AsyncStager& stager, const AsyncSaveOptions& options,
                             bool keep_error) {
  StagingOutcome outcome;
  try {
    const SaveableState source = detail::copy_before_return(SaveableState(state), options);
    if (options.staging_budget_bytes() > 0) {
      outcome.waves = std::make_shared<detail::StagingWaves>(source.leaves(), options.staging_budget_bytes());
      outcome.snapshot = source;
      return outcome;
    }
    outcome.background = stager.stage_in_background(source);
    if (!outcome.background) outcome.snapshot = stager.stage(source);
  } catch (...) {
    if (!keep_error) throw;
    outcome.error = std::current_exception();
  }
  return outcome;
}

// Where a save runs its collectives (its lane's group; none without a group) and the
// save of the lane it waits for first.
struct SaveTurn {
  std::optional<dist::ProcessGroup> group;
  std::shared_future<void> previous_save;
};

SaveTurn take_turn(const std::optional<dist::ProcessGroup>& group, const std::shared_future<Metadata>& upload) {
  if (!group) return {};
  const std::shared_ptr<AsyncSaveLane> lane = async_save_lane(*group);
  return SaveTurn{lane->group, lane->take_turn(std::async(std::launch::deferred, [upload] { upload.wait(); }).share())};
}

// One async_save's work on its own thread: waits for its snapshot and its turn, saves,
// and completes the futures. Moved into the thread, so that nothing but the save holds
// the snapshot (its buffers are freed as they are written).
class BackgroundSave {
 public:
  BackgroundSave(StorageWriter& writer, StagingOutcome staging, SaveTurn turn, int64_t rank,
                 std::shared_ptr<AsyncSavePromises> promises)
      : writer_(writer),
        staging_(std::move(staging)),
        turn_(std::move(turn)),
        rank_(rank),
        promises_(std::move(promises)) {}

  void run() {
    util::run_aten_serially_on_this_thread();
    std::optional<Metadata> committed;
    std::exception_ptr failure;
    try {
      await_snapshot();
      if (staging_.waves) staging_.waves->set_on_staged([this] { settle_waves(nullptr); });
      if (turn_.previous_save.valid()) turn_.previous_save.wait();
      committed = run_save([this] { return prepare(); }, writer_, turn_.group);
    } catch (...) {
      failure = std::current_exception();
    }
    if (staging_.waves) settle_waves(failure);
    // Done with the writer: a save waiting for this one may start on it.
    PendingSaveAccess::finished(writer_);
    if (failure) {
      promises_->upload.set_exception(failure);
    } else {
      promises_->upload.set_value(std::move(*committed));
    }
  }

 private:
  // Completes the staging future unless the caller's thread does (a snapshot taken
  // there). A staging error ends a save without a group; a group's goes on to its
  // collectives.
  void await_snapshot() {
    if (staging_.error) {
      promises_->staging.set_exception(staging_.error);
      return;
    }
    if (!staging_.background) return;
    try {
      staging_.snapshot = staging_.background->get();
      staging_.background.reset();
      promises_->staging.set_value();
    } catch (...) {
      staging_.error = std::current_exception();
      promises_->staging.set_exception(staging_.error);
      if (!turn_.group) throw;
    }
  }

  LocalSave prepare() {
    if (staging_.error) std::rethrow_exception(staging_.error);
    LocalSave local = plan_local_save(std::exchange(staging_.snapshot, SaveableState()), rank_);
    local.waves = staging_.waves;
    return local;
  }

  // Completes the staging future of a save in waves, once: when its last wave is
  // staged, or with the failure that came first.
  void settle_waves(const std::exception_ptr& failure) {
    if (waves_settled_) return;
    waves_settled_ = true;
    if (failure) {
      promises_->staging.set_exception(failure);
    } else {
      promises_->staging.set_value();
    }
  }

  StorageWriter& writer_;
  StagingOutcome staging_;
  SaveTurn turn_;
  int64_t rank_;
  std::shared_ptr<AsyncSavePromises> promises_;
  bool waves_settled_ = false;
};

// Runs `save` on a thread of its own, joined when the last copy of the response goes.
std::shared_ptr<const std::thread> start_thread(BackgroundSave save, StorageWriter& writer,
                                                AsyncSavePromises& promises) {
  try {
    return std::shared_ptr<std::thread>(new std::thread(&BackgroundSave::run, std::move(save)),
                                        [](std::thread* thread) {
                                          thread->join();
                                          delete thread;
                                        });
  } catch (...) {
    PendingSaveAccess::finished(writer);
    promises.upload.set_exception(std::current_exception());  // for a later save waiting on the stager
    throw;
  }
}

}  // namespace

AsyncSaveResponse async_save(const StateDict& state, StorageWriter& writer, AsyncStager* stager,
                             AsyncSaveOptions options, std::optional<dist::ProcessGroup> group) {
  BlockingAsyncStager fallback;  // uncached: nothing to wait for
  AsyncStager* chosen = stager;
  if (chosen == nullptr) chosen = dynamic_cast<AsyncStager*>(&writer);
  if (chosen == nullptr) chosen = &fallback;
  PendingSaveAccess::make_room(writer, *chosen, options.if_save_pending(), group);
  auto promises = std::make_shared<AsyncSavePromises>();
  AsyncSaveResponse response{promises->staging.get_future().share(), promises->upload.get_future().share(), nullptr,
                             nullptr};
  StagingOutcome staging = start_staging(state, *chosen, options, /*keep_error=*/group.has_value());
  const bool staged_now = !staging.background && !staging.waves && !staging.error;
  SaveTurn turn = take_turn(group, response.upload_completion);
  PendingSaveAccess::begin(writer, *chosen, response.upload_completion);
  const int64_t rank = group ? group->rank() : 0;
  response.background =
      start_thread(BackgroundSave(writer, std::move(staging), std::move(turn), rank, promises), writer, *promises);
  if (staged_now) {
    promises->staging.set_value();
    if (chosen->should_synchronize_after_execute()) chosen->synchronize_staging();
  }
  return response;
}

AsyncSaveResponse async_save(const StateDict& state, const std::string& checkpoint_dir, AsyncStager* stager,
                             AsyncSaveOptions options, std::optional<dist::ProcessGroup> group) {
  std::shared_ptr<StorageWriter> writer;
  try {
    writer = std::make_shared<FileSystemWriter>(checkpoint_dir);
  } catch (...) {
    if (!group) throw;
    writer = std::make_shared<UnavailableWriter>(std::current_exception());
  }
  AsyncSaveResponse response = async_save(state, *writer, stager, std::move(options), std::move(group));
  response.owned_writer = std::move(writer);
  return response;
}

}  // namespace stowage::dcp
