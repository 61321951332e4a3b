// load: the planner that reads and verifies everything before the first change, and the
// agreement of the ranks of a group before any applies it.
#include "dcp/rank_outcomes.h"
#include "dcp/storage/file_io.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/destination.h>
#include <stowage/state/stateful.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace stowage::dcp {

namespace {

// Stands in for a reader that could not be made, so that this rank still runs every
// collective of the load: its first step fails with the error.
class UnavailableReader final : public StorageReader {
 public:
  // NOLINTNEXTLINE(bugprone-throw-keyword-missing): an exception_ptr is no exception to throw (clang-tidy 14 errs)
  explicit UnavailableReader(std::exception_ptr error) : error_(std::move(error)) {}
  Metadata read_metadata() override { std::rethrow_exception(error_); }
  void read_data(std::vector<ChunkRead>&) override { std::rethrow_exception(error_); }

 private:
  std::exception_ptr error_;
};

bool is_strict_prefix(const ObjectPath& prefix, const ObjectPath& path) {
  return prefix.size() < path.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

bool is_empty_container(const c10::IValue& value) {
  return (value.isGenericDict() && value.toGenericDict().size() == 0) || (value.isList() && value.toList().size() == 0);
}

std::string describe(c10::ScalarType dtype, c10::IntArrayRef shape) {
  return fmt::format("{} [{}]", c10::toString(dtype), fmt::join(shape, ", "));
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
        refuse_saved_container(entry);
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
      for (size_t i = 0; i < direct_reads_.size(); ++i)
        stage(std::move(direct_reads_[i]), std::move(unshared_copies[i]));
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

  // An entry the checkpoint lacks but holds entries under is no missing entry, whatever
  // allow_partial_load says: the structures differ. A plain empty container (a fresh
  // optimizer's plain state dict, whose "state" is {}) cannot gain them.
  void refuse_saved_container(const FlatEntry& entry) const {
    std::vector<std::string> below;
    for (const EntryMetadata& saved : metadata_.entries) {
      if (is_strict_prefix(entry.path, saved.path)) below.push_back(saved.fqn);
    }
    if (below.empty()) return;
    if (!is_empty_container(entry.value)) {
      throw InvalidArgument(fmt::format(
          "load: entry '{}' is a {} in the state dict, but a container in the checkpoint, with {} entries (e.g. '{}')",
          entry.fqn, entry.value.tagKind(), below.size(), below.front()));
    }
    throw InvalidArgument(fmt::format(
        "load: entry '{}' is an empty {} in the state dict, but the checkpoint holds {} entries under it (e.g. "
        "'{}'), and a plain state dict cannot gain entries. Load into a Stateful instead, which receives every "
        "saved entry: for an optimizer, as_ivalue(optimizer) rather than OptimizerState(optimizer).state_dict()",
        entry.fqn, entry.value.isGenericDict() ? "dict" : "list", below.size(), below.front()));
  }

  void require_partial(const std::string& fqn) const {
    if (!options_.allow_partial_load()) {
      throw InvalidArgument(
          fmt::format("load: entry '{}' is not in the checkpoint (LoadOptions::allow_partial_load "
                      "leaves such entries as they are)",
                      fqn));
    }
  }

  static void check_shard_compatible(const FlatEntry& entry, const ShardLayout& layout, const EntryMetadata& saved) {
    const at::Tensor& tensor = entry.value.toTensor();
    if (saved.kind != EntryKind::kTensor) {
      throw InvalidArgument(
          fmt::format("load: entry '{}' is a ShardedTensor in the state dict but a {} in the checkpoint", entry.fqn,
                      saved.value.tagKind()));
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
  const detail::RankOutcome outcome = detail::attempt([&] {
    prepare();
    return metadata.save_id;
  });
  std::vector<detail::RankOutcome> outcomes;
  try {
    outcomes = detail::all_gather_outcomes(*group, outcome);
  } catch (...) {
    detail::rethrow_as_checkpoint_error("load", group->rank());
  }
  std::vector<std::string> save_ids;
  std::map<int64_t, RankFailure> failures = detail::failures_of(outcomes, &save_ids);
  if (failures.empty()) {
    for (size_t r = 1; r < save_ids.size(); ++r) {
      if (save_ids[r] != save_ids[0]) {
        failures[static_cast<int64_t>(r)] = detail::plain_failure(fmt::format(
            "read checkpoint save {} while rank 0 read save {} (replaced during the load)", save_ids[r], save_ids[0]));
      }
    }
  }
  if (!failures.empty()) throw DistributedCheckpointError("load", std::move(failures));
  planner->apply(state, reader);
}

void load(StateDict& state, const std::string& checkpoint_dir, LoadOptions options,
          std::optional<dist::ProcessGroup> group) {
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
