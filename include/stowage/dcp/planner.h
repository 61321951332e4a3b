#pragma once

// Planning a save and a load, in the steps PyTorch's DCP takes, so that a distributed
// run slots in: every rank makes a local plan; a coordinator (rank 0) gathers them,
// removes duplicates, checks they tile every tensor, and builds the metadata; each
// rank writes what its final plan says, and hashes its copies of the boxes other ranks
// hold too; the coordinator checks that those copies agree, records where every chunk
// went and commits. In one process, rank 0 is both.

#include <stowage/dcp/metadata.h>
#include <stowage/dcp/saveable_state.h>
#include <stowage/state/state_dict.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp {

// One leaf a rank offers to save.
struct WriteItem {
  std::string fqn;
  ObjectPath path;
  EntryKind kind = EntryKind::kValue;
  // kTensor: the global tensor, and the box of it this rank holds (all of it for a
  // plain tensor).
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> global_shape;
  ChunkBox box;
  int64_t nbytes = 0;
  // kValue: the value, which goes into the metadata rather than a data file.
  c10::IValue value;
  // Index of the leaf in the rank's data (the leaves of the SaveableState it planned from).
  size_t data_index = 0;
};

struct SavePlan {
  int64_t rank = 0;
  std::vector<WriteItem> items;
  // Set by the writer's global step: what this rank's data file names start with.
  std::string file_prefix;
};

// Where a rank put one chunk.
struct WriteResult {
  std::string fqn;
  ChunkBox box;
  StorageLocation location;
  int64_t rank = 0;
};

// Local step, on every rank: one item per leaf of `state`; a shard (listed in its
// layouts) offers its box of the global tensor, any other tensor the whole of it.
SavePlan create_local_save_plan(const SaveableState& state, int64_t rank);

struct GlobalSavePlan {
  std::vector<SavePlan> plans;  // indexed by rank; value items removed (they live in metadata)
  Metadata metadata;            // every entry, tensors without chunk locations yet
  // Indexed by rank: the tensor items of its local plan whose box other ranks offer too
  // (a replicated tensor, or a shard several ranks hold), whether this rank writes it or
  // not. Only one copy is written, so the copies must be the same bytes: each of these
  // ranks hashes its own (hash_replicas) and the coordinator compares them before it
  // commits (check_replicas_agree), rather than silently keep one rank's.
  std::vector<std::vector<WriteItem>> replicas;
};

// Coordinator step: plans indexed by rank. A tensor box offered by several ranks (a
// replicated tensor) is written once, by the one with the fewest bytes planned so far
// (ties: the lowest rank): boxes held by one rank are planned first, then the shared
// ones in the order the ranks list them. An empty box (no elements; it may sit at any
// offset, even where another rank's box starts) is not written, unless the whole tensor
// is empty: then it stands for the whole tensor, written once like a replicated box. A
// value is taken from the lowest rank. Every rank's items of the replicated boxes go into
// `replicas`. Throws Error naming the entry and ranks when
// ranks disagree on an entry's kind, dtype or shape, or when a tensor's non-empty boxes
// overlap, leave the tensor, or leave part of it uncovered.
GlobalSavePlan create_global_save_plan(std::vector<SavePlan> local_plans);

// One rank's copy of a box that several ranks hold: the XXH3-64 of its bytes (row-major,
// as a data file holds them).
struct ReplicaHash {
  std::string fqn;
  std::vector<int64_t> offsets;  // the box's
  int64_t rank = 0;
  uint64_t hash = 0;
};

// Each rank's step before it writes: the hashes of its replicas (its part of
// GlobalSavePlan::replicas), whose tensors `data` holds (WriteItem::data_index). A
// tensor off the CPU is copied to the host first. It reads every byte of them (XXH3
// runs at about 10 GB/s on one core).
std::vector<ReplicaHash> hash_replicas(const std::vector<WriteItem>& replicas, const std::vector<c10::IValue>& data,
                                       int64_t rank);

// Coordinator step after the writes, before the commit: throws InvalidArgument naming
// the entry (and the box's offsets, when it is a shard) and the two ranks whose copies of
// a replicated box differ, the lowest rank's against the first that differs from it.
void check_replicas_agree(const std::vector<std::vector<ReplicaHash>>& hashes_by_rank);

// Coordinator step after the writes: fills every chunk's location. Throws Error if a
// planned chunk has no result.
void record_write_results(Metadata& metadata, const std::vector<std::vector<WriteResult>>& results_by_rank);

// Part of a saved chunk that lands in part of a destination box.
struct ReadItem {
  size_t chunk_index = 0;                // into EntryMetadata::chunks
  std::vector<int64_t> storage_offsets;  // where the part starts within the saved chunk
  std::vector<int64_t> dest_offsets;     // where it starts within the destination box
  std::vector<int64_t> lengths;
};

// The reads that fill `destination` (a box of the global tensor) from the saved
// chunks: one per overlapping chunk. For a plain tensor the destination is the whole
// tensor; a rank holding a shard passes its box, so a checkpoint saved with one
// sharding loads into another.
std::vector<ReadItem> create_read_items(const EntryMetadata& entry, const ChunkBox& destination);

}  // namespace stowage::dcp
