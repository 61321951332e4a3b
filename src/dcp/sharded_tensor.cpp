#include <stowage/dcp/sharded_tensor.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace stowage::dcp {
namespace {

std::string join(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

// Whether a ShardedTensor lies anywhere under `value`.
bool holds_shard(const c10::IValue& value) {
  if (as_sharded_tensor(value)) return true;
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      if (holds_shard(item.value())) return true;
    }
  }
  if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (holds_shard(element)) return true;
    }
  }
  return false;
}

// `value` with its shards replaced by their local tensors; containers without shards
// are returned as they are (shared).
c10::IValue unshard(const c10::IValue& value, ObjectPath& path, UnshardedState& out) {
  if (const auto shard = as_sharded_tensor(value)) {
    out.layouts[path_to_string(path)] = ShardLayout{shard->global_shape(), shard->box()};
    return shard->local();
  }
  if (!holds_shard(value)) return value;
  if (value.isList()) {
    throw InvalidArgument(fmt::format("state dict entry '{}' is a list holding a ShardedTensor; put shards in dicts",
                                      path_to_string(path)));
  }
  const auto dict = value.toGenericDict();
  c10::impl::GenericDict copy(dict.keyType(), c10::AnyType::get());
  for (const auto& item : dict) {
    path.emplace_back(item.key().toStringRef());
    copy.insert(item.key(), unshard(item.value(), path, out));
    path.pop_back();
  }
  return copy;
}

}  // namespace

ShardedTensor::ShardedTensor(at::Tensor local, std::vector<int64_t> global_shape, std::vector<int64_t> offsets)
    : local_(std::move(local)), global_shape_(std::move(global_shape)), offsets_(std::move(offsets)) {
  if (!local_.defined() || local_.layout() != c10::kStrided) {
    throw InvalidArgument("ShardedTensor: the local tensor must be a defined dense tensor");
  }
  const size_t dims = global_shape_.size();
  if (static_cast<size_t>(local_.dim()) != dims || offsets_.size() != dims) {
    throw InvalidArgument(fmt::format("ShardedTensor: local shape {} and offsets {} do not match global shape {}",
                                      join(local_.sizes().vec()), join(offsets_), join(global_shape_)));
  }
  for (size_t d = 0; d < dims; ++d) {
    if (global_shape_[d] < 0 || offsets_[d] < 0 || offsets_[d] > global_shape_[d] - local_.size(d)) {
      throw InvalidArgument(fmt::format("ShardedTensor: a shard of shape {} at offsets {} leaves the global shape {}",
                                        join(local_.sizes().vec()), join(offsets_), join(global_shape_)));
    }
  }
}

ChunkBox ShardedTensor::box() const {
  return ChunkBox{offsets_, local_.sizes().vec()};
}

c10::IValue sharded_tensor(at::Tensor local, std::vector<int64_t> global_shape, std::vector<int64_t> offsets) {
  return c10::IValue::make_capsule(
      c10::make_intrusive<ShardedTensor>(std::move(local), std::move(global_shape), std::move(offsets)));
}

c10::intrusive_ptr<ShardedTensor> as_sharded_tensor(const c10::IValue& value) {
  if (!value.isCapsule()) return {};
  const c10::intrusive_ptr<torch::CustomClassHolder> holder = value.toCapsule();
  auto* shard = dynamic_cast<ShardedTensor*>(holder.get());
  if (shard == nullptr) return {};
  return c10::intrusive_ptr<ShardedTensor>::reclaim_copy(shard);
}

UnshardedState unshard_state_dict(const StateDict& state) {
  UnshardedState out;
  ObjectPath path;
  for (const auto& item : state) {
    path.emplace_back(item.key());
    out.state.insert(item.key(), unshard(item.value(), path, out));
    path.pop_back();
  }
  return out;
}

}  // namespace stowage::dcp
