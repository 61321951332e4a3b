#pragma once

// A rank's shard of a global tensor (the C++ counterpart of a DTensor's local shard for
// checkpointing): the global shape, where the shard starts in it, and the local tensor
// holding the shard. save writes each distinct shard once as a chunk of the global
// tensor; load fills the local tensor from whatever chunks the checkpoint has, so a
// checkpoint saved with one sharding loads into another (resharding).
//
// In a state dict a ShardedTensor travels as an IValue capsule (sharded_tensor()), in
// dicts only (not in lists, and not inside a Stateful's state dict).

#include <stowage/dcp/metadata.h>
#include <stowage/state/state_dict.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace stowage::dcp {

class ShardedTensor : public torch::CustomClassHolder {
 public:
  // Throws InvalidArgument unless `local` is a defined dense tensor with the global
  // tensor's number of dimensions and the box [offsets, offsets + local.sizes()) lies
  // inside global_shape.
  ShardedTensor(at::Tensor local, std::vector<int64_t> global_shape, std::vector<int64_t> offsets);

  const at::Tensor& local() const { return local_; }
  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  // The box of the global tensor this shard holds.
  ChunkBox box() const;

 private:
  at::Tensor local_;
  std::vector<int64_t> global_shape_;
  std::vector<int64_t> offsets_;
};

// A ShardedTensor as a state dict value (same checks as its constructor).
c10::IValue sharded_tensor(at::Tensor local, std::vector<int64_t> global_shape, std::vector<int64_t> offsets);
// nullptr when `value` is not a ShardedTensor.
c10::intrusive_ptr<ShardedTensor> as_sharded_tensor(const c10::IValue& value);

// Where a rank's tensor lies in its global tensor.
struct ShardLayout {
  std::vector<int64_t> global_shape;
  ChunkBox box;
};

// A state dict with every ShardedTensor replaced by its local tensor (containers above
// one are shallow-copied; the caller's state dict is not changed), and each shard's
// layout by fqn.
struct UnshardedState {
  StateDict state;
  std::unordered_map<std::string, ShardLayout> layouts;
};
UnshardedState unshard_state_dict(const StateDict& state);

}  // namespace stowage::dcp
