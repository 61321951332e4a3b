// save and async_save: one process, or the ranks of a group in step (rank_outcomes.h).
#include "dcp/copy_before_return.h"
#include "dcp/format/plan_codec.h"
#include "dcp/pending_save.h"
#include "dcp/rank_outcomes.h"
#include "dcp/saveable.h"
#include "dcp/storage/file_io.h"
#include "util/intra_op_threads.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

namespace stowage::dcp {

namespace {

// A shallow copy with every top-level Stateful replaced by its state_dict().
StateDict resolve_stateful(const StateDict& state) {
  StateDict plain;
  for (const auto& item : state) {
    if (const c10::intrusive_ptr<Stateful> object = as_stateful(item.value())) {
      plain.insert(item.key(), c10::IValue(object->state_dict()));
    } else {
      plain.insert(item.key(), item.value());
    }
  }
  return plain;
}

std::vector<c10::IValue> leaves_of(const FlatStateDict& flat) {
  std::vector<c10::IValue> data;
  data.reserve(flat.size());
  for (const FlatEntry& entry : flat.entries()) data.push_back(entry.value);
  return data;
}

// What a rank saves: its plan and the leaves the plan indexes (the writer releases
// them as it writes).
struct LocalSave {
  SavePlan plan;
  std::vector<c10::IValue> data;
};

// A rank's state with its shards' layouts, planned.
LocalSave plan_local_save(const UnshardedState& state, int64_t rank) {
  const FlatStateDict flat = flatten_state_dict(state.state);
  return LocalSave{create_local_save_plan(flat, rank, state.layouts), leaves_of(flat)};
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
    results.push_back(writer.write_data(final_plans.at(0), local.data));
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
                        return detail::encode_writes(writer.write_data(mine.plan, local.data), hashes);
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

// Plans a snapshot, dropping every reference to it but the plan's data, so that
// buffers nobody else holds (an uncached stager's) are freed as they are written.
LocalSave plan_snapshot(StateDict snapshot, const std::unordered_map<std::string, ShardLayout>& layouts, int64_t rank) {
  UnshardedState state{std::exchange(snapshot, StateDict()), layouts};
  return plan_local_save(state, rank);
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer, std::optional<dist::ProcessGroup> group) {
  PendingSaveAccess::wait(writer);
  const int64_t rank = group ? group->rank() : 0;
  return run_save([&] { return plan_local_save(unshard_state_dict(resolve_stateful(state)), rank); }, writer, group);
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

AsyncSaveResponse async_save(const StateDict& state, StorageWriter& writer, AsyncStager* stager,
                             AsyncSaveOptions options, std::optional<dist::ProcessGroup> group) {
  BlockingAsyncStager fallback;  // uncached: nothing to wait for
  AsyncStager* chosen = stager;
  if (chosen == nullptr) chosen = dynamic_cast<AsyncStager*>(&writer);
  if (chosen == nullptr) chosen = &fallback;
  PendingSaveAccess::make_room(writer, *chosen, options.if_save_pending(), group);
  auto staging = std::make_shared<std::promise<void>>();
  auto upload = std::make_shared<std::promise<Metadata>>();
  AsyncSaveResponse response{staging->get_future().share(), upload->get_future().share(), nullptr, nullptr};

  // With a group, an error here must still reach the other ranks through the
  // background save's collectives, so it is kept rather than thrown.
  std::exception_ptr early_error;
  std::optional<std::shared_future<StateDict>> background;
  StateDict snapshot;
  std::unordered_map<std::string, ShardLayout> layouts;
  try {
    UnshardedState plain = unshard_state_dict(resolve_stateful(state));
    // What save's plan would reject, rejected before staging with save's error.
    const FlatStateDict flat = flatten_state_dict(plain.state);
    for (const FlatEntry& entry : flat.entries()) {
      if (entry.value.isTensor()) detail::check_saveable_tensor(entry.fqn, entry.value.toTensor());
    }
    const StateDict source = detail::copy_before_return(state, plain.state, flat, options);
    layouts = std::move(plain.layouts);
    background = chosen->stage_in_background(source);
    if (!background) snapshot = chosen->stage(source);
  } catch (...) {
    if (!group) throw;
    early_error = std::current_exception();
  }

  std::optional<dist::ProcessGroup> save_group;
  std::shared_future<void> previous_save;
  if (group) {
    const std::shared_ptr<AsyncSaveLane> lane = async_save_lane(*group);
    save_group = lane->group;
    previous_save = lane->take_turn(
        std::async(std::launch::deferred, [upload = response.upload_completion] { upload.wait(); }).share());
  }
  const int64_t rank = group ? group->rank() : 0;
  // Moved into the thread, so not const: a const closure would be copied, and this copy
  // would hold the snapshot's buffers until async_save returns.
  auto run = [&writer, background, snapshot = std::exchange(snapshot, StateDict()), layouts, staging, upload,
              early_error, save_group, previous_save, rank]() mutable {
    util::run_aten_serially_on_this_thread();
    std::optional<Metadata> committed;
    std::exception_ptr failure;
    try {
      if (early_error) {
        staging->set_exception(early_error);
      } else if (background) {
        try {
          snapshot = background->get();
          background.reset();
          staging->set_value();
        } catch (...) {
          early_error = std::current_exception();
          staging->set_exception(early_error);
          if (!save_group) throw;
        }
      }
      if (previous_save.valid()) previous_save.wait();
      const auto prepare = [&]() -> LocalSave {
        if (early_error) std::rethrow_exception(early_error);
        return plan_snapshot(std::exchange(snapshot, StateDict()), layouts, rank);
      };
      committed = run_save(prepare, writer, save_group);
    } catch (...) {
      failure = std::current_exception();
    }
    // Done with the writer: a save waiting for this one may start on it.
    PendingSaveAccess::finished(writer);
    if (failure) {
      upload->set_exception(failure);
    } else {
      upload->set_value(std::move(*committed));
    }
  };
  PendingSaveAccess::begin(writer, *chosen, response.upload_completion);
  try {
    response.background = std::shared_ptr<std::thread>(new std::thread(std::move(run)), [](std::thread* thread) {
      thread->join();
      delete thread;
    });
  } catch (...) {
    PendingSaveAccess::finished(writer);
    upload->set_exception(std::current_exception());  // for a later save waiting on the stager
    throw;
  }
  if (!background && !early_error) {
    staging->set_value();
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
