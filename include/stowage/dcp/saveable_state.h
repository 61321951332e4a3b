#pragma once

// The state a save writes, made once per save: save and async_save build it from the
// caller's state dict, the stagers copy it, the planner plans it.

#include <stowage/dcp/sharded_tensor.h>
#include <stowage/state/state_dict.h>

#include <string>
#include <unordered_map>
#include <unordered_set>

namespace stowage::dcp {

// A state dict as a save writes it, in one pass over the caller's: every top-level
// Stateful resolved to its state_dict(), every ShardedTensor replaced by its local
// tensor (its layout kept by fqn), the result flattened (flatten_state_dict's order),
// and every tensor leaf checked saveable.
// Invariant: every tensor leaf is defined and dense (strided, unquantized); a stager's
// snapshot (with_leaves) keeps the fqns, paths and layouts of the state it copies.
class SaveableState {
 public:
  SaveableState() = default;  // no leaves
  // Throws InvalidArgument naming the entry: a value flatten_state_dict rejects, an
  // undefined tensor, or a sparse or quantized one.
  explicit SaveableState(const StateDict& state);

  const FlatStateDict& leaves() const { return leaves_; }
  // Each shard's place in its global tensor, by fqn.
  const std::unordered_map<std::string, ShardLayout>& layouts() const { return layouts_; }
  // The fqns of what the Statefuls say their forward writes
  // (Stateful::entries_written_in_forward).
  const std::unordered_set<std::string>& written_in_forward() const { return written_in_forward_; }
  // The same state with its leaves replaced by `replacements`, leaf for leaf: a
  // stager's snapshot, or async_save's copies. Throws InvalidArgument naming the entry
  // where they differ in fqn, path, or tensor against value, or a tensor is not saveable.
  SaveableState with_leaves(FlatStateDict replacements) const;
  // The leaves nested again, for a stager's direct caller.
  StateDict state_dict() const { return unflatten_state_dict(leaves_); }

 private:
  FlatStateDict leaves_;
  std::unordered_map<std::string, ShardLayout> layouts_;
  std::unordered_set<std::string> written_in_forward_;
};

}  // namespace stowage::dcp
