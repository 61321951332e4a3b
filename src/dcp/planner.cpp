#include "dcp/format/checks.h"

#include <stowage/dcp/planner.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "dcp/format/hash_state.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

namespace stowage::dcp {
namespace {

std::string describe_shape(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

SavePlan create_local_save_plan(const SaveableState& state, int64_t rank) {
  SavePlan plan;
  plan.rank = rank;
  const std::unordered_map<std::string, ShardLayout>& layouts = state.layouts();
  for (size_t i = 0; i < state.leaves().size(); ++i) {
    const FlatEntry& entry = state.leaves().entries()[i];
    WriteItem item;
    item.fqn = entry.fqn;
    item.path = entry.path;
    item.data_index = i;
    if (entry.value.isTensor()) {
      const at::Tensor& tensor = entry.value.toTensor();  // saveable: SaveableState's invariant
      item.kind = EntryKind::kTensor;
      item.dtype = tensor.scalar_type();
      if (const auto layout = layouts.find(entry.fqn); layout != layouts.end()) {
        item.global_shape = layout->second.global_shape;
        item.box = layout->second.box;
      } else {
        item.global_shape = tensor.sizes().vec();
        item.box.offsets.assign(item.global_shape.size(), 0);
        item.box.sizes = item.global_shape;
      }
      item.nbytes = static_cast<int64_t>(tensor.nbytes());
    } else {
      item.kind = EntryKind::kValue;
      item.value = entry.value;
    }
    plan.items.push_back(std::move(item));
  }
  return plan;
}

namespace {

using EntryIndex = std::unordered_map<std::string, size_t>;  // fqn: its index in Metadata::entries

// The entries of every plan, in first-seen order (the lowest rank's order first), into
// `metadata`; throws when two ranks disagree on one.
EntryIndex merge_entries(const std::vector<SavePlan>& plans, Metadata& metadata) {
  EntryIndex entry_of;
  std::unordered_map<std::string, int64_t> first_rank;
  for (const SavePlan& plan : plans) {
    for (const WriteItem& item : plan.items) {
      const auto [it, inserted] = entry_of.emplace(item.fqn, metadata.entries.size());
      if (inserted) {
        EntryMetadata entry;
        entry.fqn = item.fqn;
        entry.path = item.path;
        entry.kind = item.kind;
        entry.dtype = item.dtype;
        entry.shape = item.global_shape;
        entry.value = item.value;
        metadata.entries.push_back(std::move(entry));
        first_rank[item.fqn] = plan.rank;
        continue;
      }
      const EntryMetadata& entry = metadata.entries[it->second];
      const bool agree =
          entry.kind == item.kind && entry.path == item.path &&
          (item.kind == EntryKind::kValue || (entry.dtype == item.dtype && entry.shape == item.global_shape));
      if (!agree) {
        throw Error(fmt::format(
            "checkpoint entry '{}' differs between ranks {} and {} (kind, dtype or global shape {} vs {})", item.fqn,
            first_rank[item.fqn], plan.rank, describe_shape(entry.shape), describe_shape(item.global_shape)));
      }
    }
  }
  return entry_of;
}

// An empty box holds no bytes and may sit at any offset, even where another rank's box
// starts (an uneven split of a small tensor over many ranks): it is dropped, unless the
// whole tensor is empty, which is then written once, as one whole box.
void drop_empty_boxes(std::vector<SavePlan>& plans, const Metadata& metadata, const EntryIndex& entry_of) {
  for (SavePlan& plan : plans) {
    std::vector<WriteItem> kept;
    for (WriteItem& item : plan.items) {
      const bool empty_box = item.kind == EntryKind::kTensor && detail::checked_volume(item.box.sizes, item.fqn) == 0;
      if (empty_box) {
        const EntryMetadata& entry = metadata.entries[entry_of.at(item.fqn)];
        if (detail::checked_volume(entry.shape, item.fqn) != 0) continue;
        item.box = ChunkBox{std::vector<int64_t>(entry.shape.size(), 0), entry.shape};
      }
      kept.push_back(std::move(item));
    }
    plan.items = std::move(kept);
  }
}

using BoxKey = std::pair<std::string, std::vector<int64_t>>;  // (fqn, offsets)

// A distinct tensor box and the ranks that offer to write it.
struct Offer {
  ChunkBox box;
  int64_t nbytes = 0;
  std::vector<int64_t> ranks;
};

// The offers of every plan, in the order the boxes first appear; throws when two ranks
// hold boxes of different sizes at one offset.
std::vector<std::pair<BoxKey, Offer>> collect_offers(const std::vector<SavePlan>& plans) {
  std::map<BoxKey, size_t> offer_of;
  std::vector<std::pair<BoxKey, Offer>> offers;
  for (const SavePlan& plan : plans) {
    for (const WriteItem& item : plan.items) {
      if (item.kind != EntryKind::kTensor) continue;
      BoxKey key(item.fqn, item.box.offsets);
      const auto [it, inserted] = offer_of.emplace(key, offers.size());
      if (inserted) {
        offers.emplace_back(std::move(key), Offer{item.box, item.nbytes, {plan.rank}});
        continue;
      }
      Offer& offer = offers[it->second].second;
      if (offer.box.sizes != item.box.sizes) {
        throw Error(fmt::format("checkpoint entry '{}': ranks {} and {} hold boxes of sizes {} and {} at offsets {}",
                                item.fqn, offer.ranks.front(), plan.rank, describe_shape(offer.box.sizes),
                                describe_shape(item.box.sizes), describe_shape(item.box.offsets)));
      }
      offer.ranks.push_back(plan.rank);
    }
  }
  return offers;
}

// Each box's writer: the offering rank with the fewest bytes planned so far, boxes that
// only one rank holds first (they are that rank's bytes whatever happens). Throws unless
// every tensor entry's boxes tile it.
std::map<BoxKey, int64_t> choose_writers(std::vector<std::pair<BoxKey, Offer>> offers, const Metadata& metadata,
                                         const EntryIndex& entry_of, size_t ranks) {
  std::vector<int64_t> planned_bytes(ranks, 0);
  std::map<BoxKey, int64_t> writer_of;
  std::vector<std::vector<ChunkBox>> boxes(metadata.entries.size());
  std::stable_partition(offers.begin(), offers.end(),
                        [](const std::pair<BoxKey, Offer>& offer) { return offer.second.ranks.size() == 1; });
  for (auto& [key, offer] : offers) {
    int64_t chosen = offer.ranks.front();
    for (int64_t rank : offer.ranks) {
      if (planned_bytes[rank] < planned_bytes[chosen] ||
          (planned_bytes[rank] == planned_bytes[chosen] && rank < chosen)) {
        chosen = rank;
      }
    }
    planned_bytes[chosen] += offer.nbytes;
    writer_of.emplace(key, chosen);
    boxes[entry_of.at(key.first)].push_back(offer.box);
  }
  for (size_t i = 0; i < metadata.entries.size(); ++i) {
    const EntryMetadata& entry = metadata.entries[i];
    if (entry.kind == EntryKind::kTensor) {
      detail::check_tiling(entry.shape, boxes[i], fmt::format("checkpoint entry '{}'", entry.fqn));
    }
  }
  return writer_of;
}

}  // namespace

GlobalSavePlan create_global_save_plan(std::vector<SavePlan> local_plans) {
  GlobalSavePlan global;
  global.metadata.world_size = static_cast<int64_t>(local_plans.size());
  const EntryIndex entry_of = merge_entries(local_plans, global.metadata);
  drop_empty_boxes(local_plans, global.metadata, entry_of);
  std::vector<std::pair<BoxKey, Offer>> offers = collect_offers(local_plans);
  std::set<BoxKey> replicated;
  for (const auto& [key, offer] : offers) {
    if (offer.ranks.size() > 1) replicated.insert(key);
  }
  // Each distinct tensor box is written once, by the rank chosen for it.
  const std::map<BoxKey, int64_t> writer_of =
      choose_writers(std::move(offers), global.metadata, entry_of, local_plans.size());
  global.replicas.resize(local_plans.size());
  for (size_t r = 0; r < local_plans.size(); ++r) {
    SavePlan& plan = local_plans[r];
    std::vector<WriteItem> kept;
    for (WriteItem& item : plan.items) {
      if (item.kind != EntryKind::kTensor) continue;
      const BoxKey key(item.fqn, item.box.offsets);
      if (replicated.count(key) != 0) global.replicas[r].push_back(item);
      if (writer_of.at(key) == plan.rank) kept.push_back(std::move(item));
    }
    plan.items = std::move(kept);
  }
  global.plans = std::move(local_plans);
  global.metadata.index();
  return global;
}

std::vector<ReplicaHash> hash_replicas(const std::vector<WriteItem>& replicas, const std::vector<c10::IValue>& data,
                                       int64_t rank) {
  std::vector<ReplicaHash> hashes;
  hashes.reserve(replicas.size());
  for (const WriteItem& item : replicas) {
    // The bytes a data file would hold: row-major, on the CPU, lazy conjugation and
    // negation resolved.
    const at::Tensor host = data.at(item.data_index).toTensor().resolve_conj().resolve_neg().cpu().contiguous();
    const uint64_t hash = XXH3_64bits(host.data_ptr(), host.nbytes());
    hashes.push_back(ReplicaHash{item.fqn, item.box.offsets, rank, hash});
  }
  return hashes;
}

void check_replicas_agree(const std::vector<std::vector<ReplicaHash>>& hashes_by_rank) {
  std::map<BoxKey, const ReplicaHash*> lowest;  // each box's copy on the lowest rank that holds it
  std::vector<std::pair<const ReplicaHash*, const ReplicaHash*>> differing;
  for (const std::vector<ReplicaHash>& hashes : hashes_by_rank) {
    for (const ReplicaHash& copy : hashes) {
      const auto [first, inserted] = lowest.emplace(BoxKey(copy.fqn, copy.offsets), &copy);
      if (!inserted && first->second->hash != copy.hash) differing.emplace_back(first->second, &copy);
    }
  }
  if (differing.empty()) return;
  const auto& [first, other] = differing.front();
  const bool shard = std::any_of(first->offsets.begin(), first->offsets.end(), [](int64_t o) { return o != 0; });
  throw InvalidArgument(fmt::format(
      "checkpoint entry '{}'{} is replicated (ranks {} and {} both hold it, and only one copy is saved) but rank {}'s "
      "bytes differ from rank {}'s (XXH3-64 {:016x} and {:016x}){}; make the ranks' copies agree before saving (e.g. "
      "broadcast them from rank 0, as dist::GradientReducer does with buffers), or save each rank's under a name of "
      "its own",
      first->fqn, shard ? fmt::format(" (its box at offsets {})", describe_shape(first->offsets)) : "", first->rank,
      other->rank, other->rank, first->rank, first->hash, other->hash,
      differing.size() > 1 ? fmt::format(", and {} more copies of replicated boxes differ", differing.size() - 1)
                           : ""));
}

void record_write_results(Metadata& metadata, const std::vector<std::vector<WriteResult>>& results_by_rank) {
  std::map<std::pair<std::string, std::vector<int64_t>>, const WriteResult*> by_box;
  for (const auto& results : results_by_rank) {
    for (const WriteResult& result : results) {
      by_box[{result.fqn, result.box.offsets}] = &result;
    }
  }
  for (EntryMetadata& entry : metadata.entries) {
    if (entry.kind != EntryKind::kTensor) continue;
    entry.chunks.clear();
    for (auto it = by_box.lower_bound({entry.fqn, {}}); it != by_box.end() && it->first.first == entry.fqn; ++it) {
      const WriteResult& result = *it->second;
      entry.chunks.push_back(TensorChunk{result.box, result.location, result.rank});
    }
    std::vector<ChunkBox> boxes;
    for (const TensorChunk& chunk : entry.chunks) boxes.push_back(chunk.box);
    detail::check_tiling(entry.shape, boxes, fmt::format("checkpoint entry '{}' after writing", entry.fqn));
  }
}

std::vector<ReadItem> create_read_items(const EntryMetadata& entry, const ChunkBox& destination) {
  std::vector<ReadItem> items;
  const size_t dims = entry.shape.size();
  for (size_t c = 0; c < entry.chunks.size(); ++c) {
    const ChunkBox& saved = entry.chunks[c].box;
    ReadItem item;
    item.chunk_index = c;
    bool overlaps = true;
    for (size_t d = 0; d < dims && overlaps; ++d) {
      const int64_t begin = std::max(saved.offsets[d], destination.offsets[d]);
      const int64_t end = std::min(saved.offsets[d] + saved.sizes[d], destination.offsets[d] + destination.sizes[d]);
      overlaps = begin < end;
      item.storage_offsets.push_back(begin - saved.offsets[d]);
      item.dest_offsets.push_back(begin - destination.offsets[d]);
      item.lengths.push_back(end - begin);
    }
    // A 0-dim tensor overlaps its one chunk; an empty tensor needs no reads.
    if (overlaps && detail::checked_volume(saved.sizes, entry.fqn) != 0) {
      items.push_back(std::move(item));
    }
  }
  return items;
}

}  // namespace stowage::dcp
