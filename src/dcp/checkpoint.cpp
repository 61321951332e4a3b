#include "dcp/file_io.h"
#include "dcp/internal.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <map>

namespace stowage::dcp {

// --------------------------------------------------------- pending async saves

// The writer's record of its async_save in flight (one at a time).
class PendingSaveAccess {
 public:
  // Makes room for a new save: waits for the pending one or rejects, per `policy`.
  static void make_room(StorageWriter& writer, PendingSave policy) {
    if (policy == PendingSave::kReject && writer.has_pending_save()) {
      throw Error("async_save: a save on this writer is still in flight (PendingSave::kReject)");
    }
    writer.wait_for_pending_save();
  }
  static void set(StorageWriter& writer, std::thread thread, std::shared_future<Metadata> upload) {
    std::lock_guard<std::mutex> lock(writer.pending_mutex_);
    writer.pending_thread_ = std::move(thread);
    writer.pending_ = std::move(upload);
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

namespace {

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

// The save steps of one process, which is rank 0 and the coordinator. `data` holds the
// leaves the plan indexes; the writer releases them as it writes.
Metadata run_save(SavePlan local, std::vector<c10::IValue> data, StorageWriter& writer) {
  try {
    local = writer.prepare_local_plan(std::move(local));
    // Coordinator: gather the local plans (here, one), decide, scatter.
    std::vector<SavePlan> local_plans;
    local_plans.push_back(std::move(local));
    GlobalSavePlan global = create_global_save_plan(std::move(local_plans));
    global.metadata.save_id = detail::new_save_id();
    std::vector<SavePlan> final_plans = writer.prepare_global_plan(std::move(global.plans), global.metadata);
    // Every rank writes its part.
    std::vector<std::vector<WriteResult>> results;
    results.push_back(writer.write_data(final_plans.at(0), data));
    // Coordinator: gather the results, commit.
    record_write_results(global.metadata, results);
    writer.finish(global.metadata);
    return global.metadata;
  } catch (...) {
    writer.abort();
    throw;
  }
}

std::vector<c10::IValue> leaves_of(const FlatStateDict& flat) {
  std::vector<c10::IValue> data;
  data.reserve(flat.size());
  for (const FlatEntry& entry : flat.entries()) data.push_back(entry.value);
  return data;
}

// Saves a snapshot, dropping every reference to it but the writer's, so that buffers
// nobody else holds (an uncached stager's) are freed as they are written.
Metadata save_snapshot(StateDict snapshot, StorageWriter& writer) {
  SavePlan plan;
  std::vector<c10::IValue> data;
  {
    const FlatStateDict flat = flatten_state_dict(snapshot);
    snapshot = StateDict();  // drop this handle, so that the writer frees each buffer once written
    plan = create_local_save_plan(flat, /*rank=*/0);
    data = leaves_of(flat);
  }
  return run_save(std::move(plan), std::move(data), writer);
}

}  // namespace

Metadata save(const StateDict& state, StorageWriter& writer) {
  writer.wait_for_pending_save();
  const FlatStateDict flat = flatten_state_dict(resolve_stateful(state));
  return run_save(create_local_save_plan(flat, /*rank=*/0), leaves_of(flat), writer);
}

Metadata save(const StateDict& state, const std::string& checkpoint_dir) {
  FileSystemWriter writer(checkpoint_dir);
  return save(state, writer);
}

AsyncSaveResponse async_save(const StateDict& state, StorageWriter& writer, AsyncStager* stager,
                             AsyncSaveOptions options) {
  PendingSaveAccess::make_room(writer, options.if_save_pending());
  const StateDict plain = resolve_stateful(state);
  validate_state_dict(plain);

  BlockingAsyncStager fallback;
  AsyncStager* chosen = stager;
  if (chosen == nullptr) chosen = dynamic_cast<AsyncStager*>(&writer);
  if (chosen == nullptr) chosen = &fallback;

  std::optional<std::shared_future<StateDict>> background = chosen->stage_in_background(plain);
  StateDict snapshot;
  if (!background) snapshot = chosen->stage(plain);

  auto staging = std::make_shared<std::promise<void>>();
  auto upload = std::make_shared<std::promise<Metadata>>();
  AsyncSaveResponse response{staging->get_future().share(), upload->get_future().share()};
  std::thread thread([&writer, background, snapshot = std::exchange(snapshot, StateDict()), staging,
                      upload]() mutable {
    try {
      if (background) {
        try {
          snapshot = background->get();
          background.reset();
          staging->set_value();
        } catch (...) {
          staging->set_exception(std::current_exception());
          throw;
        }
      }
      upload->set_value(save_snapshot(std::exchange(snapshot, StateDict()), writer));
    } catch (...) {
      upload->set_exception(std::current_exception());
    }
  });
  PendingSaveAccess::set(writer, std::move(thread), response.upload_completion);
  if (!background) {
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

// A tensor to fill from the checkpoint.
struct TensorFill {
  const EntryMetadata* entry;
  at::Tensor destination;
};

// A Stateful's state dict as it will be handed to load_state_dict: its entries (paths
// include the top-level key), tensors filled in place or materialised.
struct StatefulLoad {
  c10::intrusive_ptr<Stateful> object;
  std::vector<FlatEntry> entries;
};

class LoadPlanner {
 public:
  LoadPlanner(const Metadata& metadata, LoadOptions options) : metadata_(metadata), options_(options) {}

  // Plain entries are filled in place; Stateful ones collected for load_state_dict.
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
      check_compatible(entry, *saved);
      if (saved->kind == EntryKind::kTensor) {
        fills_.push_back(TensorFill{saved, entry.value.toTensor()});
      } else {
        values_.emplace_back(entry.path, saved);
      }
    }
  }

  // Reads and verifies everything, then changes `state` and the Stateful objects.
  void execute(StateDict& state, StorageReader& reader) {
    // The state dicts for load_state_dict, built now so that a structure they cannot
    // have fails before anything changes; their tensors are filled below.
    std::vector<StateDict> stateful_states;
    for (StatefulLoad& load : statefuls_) {
      FlatStateDict relative;
      for (FlatEntry& entry : load.entries) {
        if (entry.path.size() == 1) continue;  // the whole state dict is an empty container
        ObjectPath path(entry.path.begin() + 1, entry.path.end());
        relative.add(FlatEntry{path_to_string(path), std::move(path), std::move(entry.value)});
      }
      stateful_states.push_back(unflatten_state_dict(relative));
    }
    std::vector<ChunkRead> reads;
    std::map<std::pair<const EntryMetadata*, size_t>, size_t> read_of;
    struct Copy {
      size_t fill;
      size_t read;
      ReadItem item;
    };
    std::vector<Copy> copies;
    for (size_t f = 0; f < fills_.size(); ++f) {
      const EntryMetadata& entry = *fills_[f].entry;
      const ChunkBox whole{std::vector<int64_t>(entry.shape.size(), 0), entry.shape};
      for (ReadItem& item : create_read_items(entry, whole)) {
        const auto key = std::make_pair(&entry, item.chunk_index);
        auto it = read_of.find(key);
        if (it == read_of.end()) {
          const TensorChunk& chunk = entry.chunks[item.chunk_index];
          it = read_of.emplace(key, reads.size()).first;
          reads.push_back(ChunkRead{&entry, &chunk, at::empty({chunk.location.length}, at::kByte)});
        }
        copies.push_back(Copy{f, it->second, std::move(item)});
      }
    }
    reader.read_data(reads);

    // Everything is read and verified: from here on nothing fails for want of data.
    const at::NoGradGuard no_grad;
    for (const Copy& copy : copies) {
      const EntryMetadata& entry = *fills_[copy.fill].entry;
      const TensorChunk& chunk = entry.chunks[copy.item.chunk_index];
      at::Tensor source = reads[copy.read].buffer.view(entry.dtype).view(chunk.box.sizes);
      at::Tensor destination = fills_[copy.fill].destination;
      for (size_t d = 0; d < copy.item.lengths.size(); ++d) {
        source = source.narrow(static_cast<int64_t>(d), copy.item.storage_offsets[d], copy.item.lengths[d]);
        destination = destination.narrow(static_cast<int64_t>(d), copy.item.dest_offsets[d], copy.item.lengths[d]);
      }
      destination.copy_(source);
    }
    for (const auto& [path, saved] : values_) {
      set_leaf(state, path, saved->value);
    }
    for (size_t i = 0; i < statefuls_.size(); ++i) {
      statefuls_[i].object->load_state_dict(stateful_states[i]);
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

  void require_partial(const std::string& fqn) const {
    if (!options_.allow_partial_load()) {
      throw InvalidArgument(fmt::format("load: entry '{}' is not in the checkpoint (LoadOptions::allow_partial_load "
                                        "leaves such entries as they are)",
                                        fqn));
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
    StatefulLoad load{object, {}};
    for (const FlatEntry& entry : current.entries()) {
      if (const EntryMetadata* saved = find(entry)) {
        check_compatible(entry, *saved);
        if (saved->kind == EntryKind::kTensor) {
          fills_.push_back(TensorFill{saved, entry.value.toTensor()});
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
    // Entries the object does not have yet: materialised on the CPU as saved.
    for (const EntryMetadata* saved : saved_under_key) {
      if (current.contains(saved->fqn)) continue;
      if (saved->kind == EntryKind::kTensor) {
        at::Tensor tensor = at::empty(saved->shape, at::TensorOptions().dtype(saved->dtype));
        fills_.push_back(TensorFill{saved, tensor});
        load.entries.push_back(FlatEntry{saved->fqn, saved->path, tensor});
      } else {
        load.entries.push_back(FlatEntry{saved->fqn, saved->path, saved->value});
      }
    }
    statefuls_.push_back(std::move(load));
  }

  const Metadata& metadata_;
  LoadOptions options_;
  std::vector<TensorFill> fills_;
  std::vector<std::pair<ObjectPath, const EntryMetadata*>> values_;
  std::vector<StatefulLoad> statefuls_;
};

}  // namespace

void load(StateDict& state, StorageReader& reader, LoadOptions options) {
  const Metadata metadata = reader.read_metadata();
  LoadPlanner planner(metadata, options);
  for (const auto& item : state) {
    planner.add(item.key(), item.value());
  }
  planner.execute(state, reader);
}

void load(StateDict& state, const std::string& checkpoint_dir, LoadOptions options) {
  FileSystemReader reader(checkpoint_dir);
  load(state, reader, options);
}

}  // namespace stowage::dcp
