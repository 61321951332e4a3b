#include "dcp/file_io.h"
#include "dcp/internal.h"
#include "exception_message.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/destination.h>
#include <stowage/state/stateful.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <functional>
#include <unordered_map>

namespace stowage::dcp {

// --------------------------------------------------------- pending async saves

// The writer's record of its async_save in flight (one at a time).
class PendingSaveAccess {
 public:
  // Makes room for a new save: waits for the pending one or rejects, per `policy`.
  // With a group the ranks decide together, on the caller's thread before anything
  // starts, so that no rank's background save waits for a rank that rejected: if any
  // rank would reject, every rank does, naming those with a save in flight. The same
  // holds for a stager that reuses its buffers (AsyncStager::reuses_buffers()): the save
  // writing its previous snapshot, on any writer, is waited for or rejected.
  static void make_room(StorageWriter& writer, AsyncStager& stager, PendingSave policy,
                        const std::optional<dist::ProcessGroup>& group);
  static void set(StorageWriter& writer, AsyncStager& stager, std::thread thread,
                  const std::shared_future<Metadata>& upload) {
    if (stager.reuses_buffers()) stager.latest_save_ = upload;
    std::lock_guard<std::mutex> lock(writer.pending_mutex_);
    writer.pending_thread_ = std::move(thread);
    writer.pending_ = upload;
  }

 private:
  static bool stager_busy(const AsyncStager& stager) {
    return stager.latest_save_.valid() &&
           stager.latest_save_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
  }
};

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

CheckpointError::CheckpointError(std::string step, std::map<int64_t, std::string> failures)
    : Error([&] {
        std::string text = fmt::format("distributed checkpoint failed in step '{}':", step);
        for (const auto& [rank, cause] : failures) text += fmt::format(" [rank {}] {}", rank, cause);
        return text;
      }()),
      step_(std::move(step)),
      failures_(std::move(failures)) {}

namespace {

// The failures to report for a collective that failed: the ranks that did not check in
// afterwards, or else this rank, with the group's account of it.
std::map<int64_t, std::string> collective_failures(const dist::CollectiveError& error, int64_t rank) {
  std::map<int64_t, std::string> failures;
  for (const int64_t missing : error.unresponsive_ranks()) {
    failures[missing] = fmt::format("dead or unresponsive: {}", error.what());
  }
  if (failures.empty()) failures[rank] = error.what();
  return failures;
}

// Rethrows the exception in flight, a dist::CollectiveError as a CheckpointError of `step`.
[[noreturn]] void rethrow_as_checkpoint_error(const char* step, int64_t rank) {
  try {
    throw;
  } catch (const dist::CollectiveError& e) {
    throw CheckpointError(step, collective_failures(e, rank));
  }
}

}  // namespace

void PendingSaveAccess::make_room(StorageWriter& writer, AsyncStager& stager, PendingSave policy,
                                  const std::optional<dist::ProcessGroup>& group) {
  std::string rejected;  // why this rank rejects, if it does
  if (policy == PendingSave::kReject) {
    if (writer.has_pending_save()) {
      rejected = "a save on its writer is still in flight (PendingSave::kReject)";
    } else if (stager.reuses_buffers() && stager_busy(stager)) {
      rejected = "a save of its stager's previous snapshot (whose buffers the stager reuses) is still in flight, "
                 "possibly on another writer (PendingSave::kReject)";
    }
  }
  if (group) {
    std::vector<std::string> votes;
    try {
      votes = group->all_gather(rejected);
    } catch (...) {
      rethrow_as_checkpoint_error("start", group->rank());
    }
    std::map<int64_t, std::string> rejecting;
    for (size_t r = 0; r < votes.size(); ++r) {
      if (!votes[r].empty()) rejecting[static_cast<int64_t>(r)] = votes[r];
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

namespace {

using nlohmann::json;

// ------------------------------------------------------------------- saving

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

// ---- The distributed steps. Invariant: every rank runs every collective of a save
// (or load), in the same order, whatever failed, so that failures travel as data and
// the group stays in step. Only a collective's own failure (a dead or hung rank) ends
// a rank's part early.

// A rank's outcome of one step: {"ok": true, "v": payload} or {"ok": false, "v": cause}.
template <typename Step>
std::string attempt(Step&& step) {
  try {
    return json{{"ok", true}, {"v", step()}}.dump();
  } catch (const std::exception& e) {
    return json{{"ok", false}, {"v", exception_message(e)}}.dump();
  } catch (...) {
    return json{{"ok", false}, {"v", "unknown exception"}}.dump();
  }
}

// The failed ranks among gathered outcomes, and the payloads of the others.
std::map<int64_t, std::string> failures_of(const std::vector<std::string>& outcomes,
                                           std::vector<std::string>* payloads = nullptr) {
  std::map<int64_t, std::string> failures;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    const json outcome = json::parse(outcomes[r]);
    if (outcome.at("ok").get<bool>()) {
      if (payloads != nullptr) payloads->push_back(outcome.at("v").get<std::string>());
    } else {
      failures[static_cast<int64_t>(r)] = outcome.at("v").get<std::string>();
    }
  }
  return failures;
}

// The coordinator's verdict on a step, sent to every rank: the rank's payload, or the
// failures.
std::string verdict_ok(const std::string& payload) {
  return json{{"ok", true}, {"v", payload}}.dump();
}
std::string verdict_failed(const std::map<int64_t, std::string>& failures) {
  json list = json::array();
  for (const auto& [rank, cause] : failures) list.push_back(json{rank, cause});
  return json{{"ok", false}, {"failures", std::move(list)}}.dump();
}
// The payload of a verdict, or CheckpointError with its failures.
std::string accept(const std::string& verdict, const char* step) {
  const json parsed = json::parse(verdict);
  if (parsed.at("ok").get<bool>()) return parsed.at("v").get<std::string>();
  std::map<int64_t, std::string> failures;
  for (const json& failure : parsed.at("failures")) failures[failure.at(0).get<int64_t>()] = failure.at(1).get<std::string>();
  throw CheckpointError(step, std::move(failures));
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
    const std::string planned = attempt([&] {
      local = prepare();
      local.plan.rank = rank;
      return detail::encode_save_plan(writer.prepare_local_plan(std::move(local.plan)));
    });
    const std::vector<std::string> gathered_plans = group.gather(planned, kCoordinator);
    std::vector<std::string> plan_verdicts;
    Metadata metadata;
    if (coordinator) {
      std::vector<std::string> encoded;
      std::map<int64_t, std::string> failures = failures_of(gathered_plans, &encoded);
      if (failures.empty()) {
        try {
          std::vector<SavePlan> plans;
          for (const std::string& plan : encoded) plans.push_back(detail::decode_save_plan(plan));
          GlobalSavePlan global = create_global_save_plan(std::move(plans));
          global.metadata.save_id = detail::new_save_id();
          for (const SavePlan& plan : writer.prepare_global_plan(std::move(global.plans), global.metadata)) {
            plan_verdicts.push_back(verdict_ok(detail::encode_save_plan(plan)));
          }
          metadata = std::move(global.metadata);
        } catch (const std::exception& e) {
          failures[rank] = fmt::format("coordinator: {}", exception_message(e));
        }
      }
      if (!failures.empty()) plan_verdicts.assign(group.size(), verdict_failed(failures));
    }
    const std::string my_plan = group.scatter(plan_verdicts, kCoordinator);
    step = "write";

    // Write: every rank writes its part, unless planning failed anywhere.
    const bool plan_failed = !json::parse(my_plan).at("ok").get<bool>();
    const std::string written =
        plan_failed ? json{{"ok", false}, {"v", "nothing written: planning failed"}}.dump() : attempt([&] {
          const SavePlan plan = detail::decode_save_plan(accept(my_plan, "plan"));
          return detail::encode_write_results(writer.write_data(plan, local.data));
        });
    const std::vector<std::string> gathered_results = group.gather(written, kCoordinator);
    verdict_pending = true;
    step = "commit";

    // Commit: the coordinator records where every chunk went and commits.
    std::string commit_verdict;
    if (coordinator) {
      std::vector<std::string> encoded;
      std::map<int64_t, std::string> failures = failures_of(gathered_results, &encoded);
      if (plan_failed) {
        commit_verdict = my_plan;
      } else if (!failures.empty()) {
        commit_verdict = verdict_failed(failures);
      } else {
        try {
          std::vector<std::vector<WriteResult>> results;
          for (const std::string& result : encoded) results.push_back(detail::decode_write_results(result));
          record_write_results(metadata, results);
          writer.finish(metadata);
          commit_verdict = verdict_ok(encode_metadata(metadata));
        } catch (const std::exception& e) {
          commit_verdict = verdict_failed({{rank, fmt::format("coordinator: {}", exception_message(e))}});
        }
      }
    }
    const std::string committed = group.broadcast(commit_verdict, kCoordinator);
    verdict_pending = false;
    if (plan_failed) accept(my_plan, "plan");
    const std::string text = accept(committed, "write");
    if (coordinator) return metadata;
    return decode_metadata(text, fmt::format("from rank {}", kCoordinator));
  } catch (...) {
    if (!verdict_pending) writer.abort();
    rethrow_as_checkpoint_error(step, rank);
  }
}

Metadata run_save(const std::function<LocalSave()>& prepare, StorageWriter& writer,
                  const std::optional<dist::ProcessGroup>& group) {
  if (group) return run_distributed_save(prepare, writer, *group);
  return run_local_save(prepare(), writer);
}

// Plans a snapshot, dropping every reference to it but the plan's data, so that
// buffers nobody else holds (an uncached stager's) are freed as they are written.
LocalSave plan_snapshot(StateDict snapshot, const std::unordered_map<std::string, ShardLayout>& layouts,
                        int64_t rank) {
  UnshardedState state{std::exchange(snapshot, StateDict()), layouts};
  return plan_local_save(state, rank);
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer, std::optional<dist::ProcessGroup> group) {
  writer.wait_for_pending_save();
  const int64_t rank = group ? group->rank() : 0;
  return run_save([&] { return plan_local_save(unshard_state_dict(resolve_stateful(state)), rank); }, writer, group);
}

namespace {

// Stands in for a writer or reader that could not be made, so that this rank still
// runs every collective of the save or load: its first step fails with the error.
class UnavailableWriter final : public StorageWriter {
 public:
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

class UnavailableReader final : public StorageReader {
 public:
  explicit UnavailableReader(std::exception_ptr error) : error_(std::move(error)) {}
  Metadata read_metadata() override { std::rethrow_exception(error_); }
  void read_data(std::vector<ChunkRead>&) override { std::rethrow_exception(error_); }

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
  AsyncSaveResponse response{staging->get_future().share(), upload->get_future().share()};

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
    layouts = std::move(plain.layouts);
    background = chosen->stage_in_background(plain.state);
    if (!background) snapshot = chosen->stage(plain.state);
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
  std::thread thread([&writer, background, snapshot = std::exchange(snapshot, StateDict()), layouts, staging, upload,
                      early_error, save_group, previous_save, rank]() mutable {
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
      upload->set_value(run_save(prepare, writer, save_group));
    } catch (...) {
      upload->set_exception(std::current_exception());
    }
  });
  PendingSaveAccess::set(writer, *chosen, std::move(thread), response.upload_completion);
  if (!background && !early_error) {
    staging->set_value();
    if (chosen->should_synchronize_after_execute()) chosen->synchronize_staging();
  }
  return response;
}

// ------------------------------------------------------------------- loading

namespace {

bool is_strict_prefix(const ObjectPath& prefix, const ObjectPath& path) {
  return prefix.size() < path.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

bool is_empty_container(const c10::IValue& value) {
  return (value.isGenericDict() && value.toGenericDict().size() == 0) || (value.isList() && value.toList().size() == 0);
}

std::string describe(c10::ScalarType dtype, c10::IntArrayRef shape) {
  return fmt::format("{} [{}]", c10::toString(dtype), fmt::join(shape, ", "));
}

// Replaces the leaf at `path` inside `root`; containers are shared, so this edits the
// caller's nested dicts and lists.
void set_leaf(StateDict& root, const ObjectPath& path, const c10::IValue& value) {
  if (path.size() == 1) {
    root.insert_or_assign(std::get<std::string>(path.front()), value);
    return;
  }
  c10::IValue parent = root.at(std::get<std::string>(path.front()));
  for (size_t i = 1; i + 1 < path.size(); ++i) {
    parent = parent.isGenericDict() ? parent.toGenericDict().at(std::get<std::string>(path[i]))
                                    : parent.toList().get(std::get<int64_t>(path[i]));
  }
  if (parent.isGenericDict()) {
    parent.toGenericDict().insert_or_assign(std::get<std::string>(path.back()), value);
  } else {
    parent.toList().set(std::get<int64_t>(path.back()), value);
  }
}

// A tensor to fill from the checkpoint: `destination` holds the box `box` of the saved
// tensor (all of it unless it is a shard).
struct TensorFill {
  const EntryMetadata* entry;
  at::Tensor destination;
  ChunkBox box;
};

ChunkBox whole_box(const std::vector<int64_t>& shape) {
  return ChunkBox{std::vector<int64_t>(shape.size(), 0), shape};
}

// A Stateful's state dict as it will be handed to load_state_dict: its entries (paths
// include the top-level key), tensors filled in place or materialised.
struct StatefulLoad {
  std::string key;
  c10::intrusive_ptr<Stateful> object;
  std::vector<FlatEntry> entries;
};

class LoadPlanner {
 public:
  LoadPlanner(const Metadata& metadata, LoadOptions options, std::unordered_map<std::string, ShardLayout> layouts)
      : metadata_(metadata), options_(options), layouts_(std::move(layouts)) {}

  // Plain entries are filled in place; Stateful ones collected for load_state_dict.
  // Shards come as their local tensors, with their layouts given to the constructor.
  void add(const std::string& key, const c10::IValue& value) {
    if (const c10::intrusive_ptr<Stateful> object = as_stateful(value)) {
      add_stateful(key, object);
      return;
    }
    StateDict wrapper;
    wrapper.insert(key, value);
    const FlatStateDict flat = flatten_state_dict(wrapper);
    for (const FlatEntry& entry : flat.entries()) {
      const EntryMetadata* saved = find(entry);
      if (saved == nullptr) {
        require_partial(entry.fqn);
        continue;
      }
      const auto layout = layouts_.find(entry.fqn);
      if (layout != layouts_.end()) {
        check_shard_compatible(entry, layout->second, *saved);
        add_fill(entry, saved, layout->second.box);
        continue;
      }
      check_compatible(entry, *saved);
      if (saved->kind == EntryKind::kTensor) {
        add_fill(entry, saved, whole_box(saved->shape));
      } else {
        values_.emplace_back(entry.path, saved);
      }
    }
  }

  // Reads and verifies everything the load needs; changes nothing.
  void read(StorageReader& reader) {
    // The state dicts for load_state_dict, built and checked by their objects now so
    // that a structure they cannot take fails before anything changes; their tensors
    // are filled by apply().
    for (StatefulLoad& load : statefuls_) {
      FlatStateDict relative;
      for (FlatEntry& entry : load.entries) {
        if (entry.path.size() == 1) continue;  // the whole state dict is an empty container
        ObjectPath path(entry.path.begin() + 1, entry.path.end());
        relative.add(FlatEntry{path_to_string(path), std::move(path), std::move(entry.value)});
      }
      stateful_states_.push_back(unflatten_state_dict(relative));
      try {
        load.object->check_load_state_dict(stateful_states_.back());
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("load: entry '{}': {}", load.key, e.what()));
      }
    }
    // One read per (destination, overlapping saved chunk), of the overlap only: straight
    // into the destination where that is plain CPU memory that no other read writes,
    // else into a buffer of ours that apply() copies from.
    std::vector<Copy> direct_copies;
    for (size_t f = 0; f < fills_.size(); ++f) {
      const EntryMetadata& entry = *fills_[f].entry;
      for (ReadItem& item : create_read_items(entry, fills_[f].box)) {
        const TensorChunk& chunk = entry.chunks[item.chunk_index];
        ChunkRead read{&entry, &chunk, destination_of(Copy{f, item}), ChunkBox{item.storage_offsets, item.lengths}};
        if (takes_raw_bytes(read.buffer)) {
          direct_reads_.push_back(std::move(read));
          direct_copies.push_back(Copy{f, std::move(item)});
        } else {
          stage(std::move(read), Copy{f, std::move(item)});
        }
      }
    }
    // Destinations sharing memory (tied weights under two keys) are filled by copies,
    // in order, as if each were assigned in turn: every cluster of overlapping
    // destinations is staged.
    std::vector<size_t> order;
    for (size_t i = 0; i < direct_reads_.size(); ++i) {
      if (direct_reads_[i].buffer.nbytes() > 0) order.push_back(i);
    }
    const auto begin = [&](size_t i) { return static_cast<const char*>(direct_reads_[i].buffer.data_ptr()); };
    const auto end = [&](size_t i) { return begin(i) + direct_reads_[i].buffer.nbytes(); };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return begin(a) < begin(b); });
    std::vector<bool> shared(direct_reads_.size(), false);
    for (size_t first = 0; first < order.size();) {
      size_t last = first + 1;  // the cluster is order[first, last)
      const char* reach = end(order[first]);
      while (last < order.size() && begin(order[last]) < reach) reach = std::max(reach, end(order[last++]));
      if (last - first > 1) {
        for (size_t k = first; k < last; ++k) shared[order[k]] = true;
      }
      first = last;
    }
    std::vector<ChunkRead> unshared_reads;
    std::vector<Copy> unshared_copies;
    for (size_t i = 0; i < direct_reads_.size(); ++i) {
      if (shared[i]) {
        stage(std::move(direct_reads_[i]), std::move(direct_copies[i]));
      } else {
        unshared_reads.push_back(std::move(direct_reads_[i]));
        unshared_copies.push_back(std::move(direct_copies[i]));
      }
    }
    direct_reads_ = std::move(unshared_reads);
    if (!direct_reads_.empty() && !reader.verify_data(direct_reads_)) {
      for (size_t i = 0; i < direct_reads_.size(); ++i) stage(std::move(direct_reads_[i]), std::move(unshared_copies[i]));
      direct_reads_.clear();
    }
    reader.read_data(staged_reads_);
  }

  // Fills the destinations and replaces the values. Nothing fails for want of data,
  // unless a data file changed since read() verified it.
  void apply(StateDict& state, StorageReader& reader) {
    const at::NoGradGuard no_grad;
    reader.read_data(direct_reads_);
    for (ChunkRead& read : direct_reads_) read.buffer.unsafeGetTensorImpl()->bump_version();  // as copy_ would
    for (size_t i = 0; i < copies_.size(); ++i) {
      const EntryMetadata& entry = *fills_[copies_[i].fill].entry;
      destination_of(copies_[i]).copy_(staged_reads_[i].buffer.view(entry.dtype).view(copies_[i].item.lengths));
    }
    for (const auto& [path, saved] : values_) {
      set_leaf(state, path, saved->value);
    }
    for (size_t i = 0; i < statefuls_.size(); ++i) {
      statefuls_[i].object->load_state_dict(stateful_states_[i]);
    }
  }

 private:
  const EntryMetadata* find(const FlatEntry& entry) const {
    const EntryMetadata* saved = metadata_.find(entry.fqn);
    if (saved != nullptr && saved->path != entry.path) {
      throw InvalidArgument(fmt::format(
          "load: entry '{}' has a different structure in the checkpoint (keys containing dots?)", entry.fqn));
    }
    return saved;
  }

  // Fills `entry`'s tensor with the box `box` of `saved`, once checked writable.
  void add_fill(const FlatEntry& entry, const EntryMetadata* saved, ChunkBox box) {
    const at::Tensor& destination = entry.value.toTensor();
    check_writable_destination(destination, fmt::format("load: entry '{}'", entry.fqn));
    fills_.push_back(TensorFill{saved, destination, std::move(box)});
  }

  void require_partial(const std::string& fqn) const {
    if (!options_.allow_partial_load()) {
      throw InvalidArgument(fmt::format("load: entry '{}' is not in the checkpoint (LoadOptions::allow_partial_load "
                                        "leaves such entries as they are)",
                                        fqn));
    }
  }

  static void check_shard_compatible(const FlatEntry& entry, const ShardLayout& layout, const EntryMetadata& saved) {
    const at::Tensor& tensor = entry.value.toTensor();
    if (saved.kind != EntryKind::kTensor) {
      throw InvalidArgument(fmt::format("load: entry '{}' is a ShardedTensor in the state dict but a {} in the checkpoint",
                                        entry.fqn, saved.value.tagKind()));
    }
    if (tensor.scalar_type() != saved.dtype || layout.global_shape != saved.shape) {
      throw InvalidArgument(fmt::format("load: entry '{}' is a shard of {} in the state dict but {} in the checkpoint",
                                        entry.fqn, describe(tensor.scalar_type(), layout.global_shape),
                                        describe(saved.dtype, saved.shape)));
    }
  }

  static void check_compatible(const FlatEntry& entry, const EntryMetadata& saved) {
    if (entry.value.isTensor()) {
      const at::Tensor& tensor = entry.value.toTensor();
      if (!tensor.defined()) throw InvalidArgument(fmt::format("load: entry '{}' is an undefined tensor", entry.fqn));
      if (saved.kind != EntryKind::kTensor) {
        throw InvalidArgument(fmt::format("load: entry '{}' is a tensor in the state dict but a {} in the checkpoint",
                                          entry.fqn, saved.value.tagKind()));
      }
      if (tensor.scalar_type() != saved.dtype || tensor.sizes() != c10::IntArrayRef(saved.shape)) {
        throw InvalidArgument(fmt::format("load: entry '{}' is {} in the state dict but {} in the checkpoint",
                                          entry.fqn, describe(tensor.scalar_type(), tensor.sizes()),
                                          describe(saved.dtype, saved.shape)));
      }
    } else if (saved.kind == EntryKind::kTensor) {
      throw InvalidArgument(fmt::format("load: entry '{}' is a {} in the state dict but a tensor in the checkpoint",
                                        entry.fqn, entry.value.tagKind()));
    }
  }

  void add_stateful(const std::string& key, const c10::intrusive_ptr<Stateful>& object) {
    StateDict wrapper;
    wrapper.insert(key, c10::IValue(object->state_dict()));
    const FlatStateDict current = flatten_state_dict(wrapper);
    std::vector<const EntryMetadata*> saved_under_key;
    for (const EntryMetadata& saved : metadata_.entries) {
      if (std::get<std::string>(saved.path.front()) == key) saved_under_key.push_back(&saved);
    }
    StatefulLoad load{key, object, {}};
    for (const FlatEntry& entry : current.entries()) {
      if (const EntryMetadata* saved = find(entry)) {
        check_compatible(entry, *saved);
        if (saved->kind == EntryKind::kTensor) {
          add_fill(entry, saved, whole_box(saved->shape));
          load.entries.push_back(entry);
        } else {
          load.entries.push_back(FlatEntry{entry.fqn, entry.path, saved->value});
        }
        continue;
      }
      // An empty container the checkpoint fills (a fresh optimizer's "state": {}), or
      // entries inside a container the checkpoint saved empty: the checkpoint's
      // structure wins, and its entries are taken below.
      const bool filled_by_checkpoint =
          is_empty_container(entry.value) &&
          std::any_of(saved_under_key.begin(), saved_under_key.end(),
                      [&](const EntryMetadata* saved) { return is_strict_prefix(entry.path, saved->path); });
      const bool emptied_by_checkpoint =
          std::any_of(saved_under_key.begin(), saved_under_key.end(), [&](const EntryMetadata* saved) {
            return is_empty_container(saved->value) && is_strict_prefix(saved->path, entry.path);
          });
      if (filled_by_checkpoint || emptied_by_checkpoint) continue;
      require_partial(entry.fqn);
      load.entries.push_back(entry);
    }
    // Entries the object does not have yet and needs: materialised on the CPU as saved.
    for (const EntryMetadata* saved : saved_under_key) {
      if (current.contains(saved->fqn)) continue;
      if (!object->needs_saved_entry(ObjectPath(saved->path.begin() + 1, saved->path.end()))) continue;
      if (saved->kind == EntryKind::kTensor) {
        at::Tensor tensor = at::empty(saved->shape, at::TensorOptions().dtype(saved->dtype));
        fills_.push_back(TensorFill{saved, tensor, whole_box(saved->shape)});
        load.entries.push_back(FlatEntry{saved->fqn, saved->path, tensor});
      } else {
        load.entries.push_back(FlatEntry{saved->fqn, saved->path, saved->value});
      }
    }
    statefuls_.push_back(std::move(load));
  }

  struct Copy {
    size_t fill;
    ReadItem item;
  };

  // The part of a fill's destination that a read item fills.
  at::Tensor destination_of(const Copy& copy) const {
    at::Tensor destination = fills_[copy.fill].destination;
    for (size_t d = 0; d < copy.item.lengths.size(); ++d) {
      destination = destination.narrow(static_cast<int64_t>(d), copy.item.dest_offsets[d], copy.item.lengths[d]);
    }
    return destination;
  }

  // Whether the saved bytes, as they are, are the tensor's contents.
  static bool takes_raw_bytes(const at::Tensor& tensor) {
    return tensor.device().is_cpu() && tensor.layout() == c10::kStrided && tensor.is_contiguous() &&
           !tensor.is_conj() && !tensor.is_neg();
  }

  void stage(ChunkRead read, Copy copy) {
    read.buffer = at::empty({static_cast<int64_t>(read.buffer.nbytes())}, at::kByte);
    staged_reads_.push_back(std::move(read));
    copies_.push_back(std::move(copy));
  }

  const Metadata& metadata_;
  LoadOptions options_;
  std::unordered_map<std::string, ShardLayout> layouts_;
  std::vector<TensorFill> fills_;
  std::vector<ChunkRead> direct_reads_;  // into the destinations; verified by read()
  std::vector<ChunkRead> staged_reads_;  // read by read()
  std::vector<Copy> copies_;             // copies_[i] takes staged_reads_[i]
  std::vector<StateDict> stateful_states_;
  std::vector<std::pair<ObjectPath, const EntryMetadata*>> values_;
  std::vector<StatefulLoad> statefuls_;
};

}  // namespace

void load(StateDict& state, StorageReader& reader, LoadOptions options, std::optional<dist::ProcessGroup> group) {
  Metadata metadata;
  std::optional<LoadPlanner> planner;
  const auto prepare = [&] {
    metadata = reader.read_metadata();
    UnshardedState plain = unshard_state_dict(state);
    planner.emplace(metadata, options, std::move(plain.layouts));
    for (const auto& item : plain.state) {
      planner->add(item.key(), item.value());
    }
    planner->read(reader);
  };
  if (!group) {
    prepare();
    planner->apply(state, reader);
    return;
  }
  // Every rank reads and verifies, then all agree before any state changes.
  const std::string outcome = attempt([&] {
    prepare();
    return metadata.save_id;
  });
  std::vector<std::string> outcomes;
  try {
    outcomes = group->all_gather(outcome);
  } catch (...) {
    rethrow_as_checkpoint_error("load", group->rank());
  }
  std::vector<std::string> save_ids;
  std::map<int64_t, std::string> failures = failures_of(outcomes, &save_ids);
  if (failures.empty()) {
    for (size_t r = 1; r < save_ids.size(); ++r) {
      if (save_ids[r] != save_ids[0]) {
        failures[static_cast<int64_t>(r)] = fmt::format(
            "read checkpoint save {} while rank 0 read save {} (replaced during the load)", save_ids[r], save_ids[0]);
      }
    }
  }
  if (!failures.empty()) throw CheckpointError("load", std::move(failures));
  planner->apply(state, reader);
}

void load(StateDict& state, const std::string& checkpoint_dir, LoadOptions options, std::optional<dist::ProcessGroup> group) {
  std::optional<FileSystemReader> reader;
  try {
    reader.emplace(checkpoint_dir);
  } catch (...) {
    if (!group) throw;
    UnavailableReader unavailable(std::current_exception());
    load(state, unavailable, options, std::move(group));
    return;
  }
  load(state, *reader, options, std::move(group));
}

}  // namespace stowage::dcp
