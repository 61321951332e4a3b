#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/copy.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace stowage {
namespace {

std::string leaf_kind(const c10::IValue& value) {
  return value.tagKind();
}

std::string describe_tensor(const at::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"));
}

// Containers have reference semantics, so this edits dst's nested dicts and lists in place.
void replace_leaf(StateDict& dst, const ObjectPath& path, const c10::IValue& value) {
  c10::IValue parent = dst.at(std::get<std::string>(path.front()));
  if (path.size() == 1) {
    dst.insert_or_assign(std::get<std::string>(path.front()), value);
    return;
  }
  for (size_t i = 1; i + 1 < path.size(); ++i) {
    parent = parent.isGenericDict() ? parent.toGenericDict().at(std::get<std::string>(path[i]))
                                    : parent.toList().get(std::get<int64_t>(path[i]));
  }
  const PathElement& last = path.back();
  if (parent.isGenericDict()) {
    parent.toGenericDict().insert_or_assign(std::get<std::string>(last), value);
  } else {
    parent.toList().set(std::get<int64_t>(last), value);
  }
}

}  // namespace

c10::IValue copy_leaf(const c10::IValue& leaf) {
  if (leaf.isList()) return leaf.toList().copy();  // a leaf list holds only immutable values
  if (leaf.isGenericDict()) {
    const c10::impl::GenericDict dict = leaf.toGenericDict();
    return dict.copy();  // a leaf dict is empty
  }
  return leaf;
}

StateDict create_cpu_state_dict(const StateDict& state, CpuStateDictOptions options) {
  return unflatten_state_dict(create_cpu_state_dict(flatten_state_dict(state), options));
}

FlatStateDict create_cpu_state_dict(const FlatStateDict& flat, CpuStateDictOptions options) {
  std::vector<memory::HostTensorSpec> specs;
  memory::HostAllocOptions host_options{options.pin_memory, options.share_memory};
  host_options.use = memory::HostBufferUse::kCheckpoint;  // DCP's staging copies
  for (const FlatEntry& entry : flat.entries()) {
    if (!entry.value.isTensor()) continue;
    const at::Tensor& source = entry.value.toTensor();
    if (!source.defined()) {
      throw InvalidArgument(fmt::format("state dict entry '{}' is an undefined tensor", entry.fqn));
    }
    if (!source.is_cpu()) host_options.pin_for = source.device().type();
    specs.push_back(memory::HostTensorSpec{source.sizes().vec(), source.scalar_type()});
  }
  const std::vector<at::Tensor> buffers = memory::allocate_host_tensors(specs, host_options, kCpuStateDictArenaBytes);
  FlatStateDict staged;
  size_t next_buffer = 0;
  for (const FlatEntry& entry : flat.entries()) {
    staged.add(FlatEntry{entry.fqn, entry.path,
                         entry.value.isTensor() ? c10::IValue(buffers[next_buffer++]) : copy_leaf(entry.value)});
  }
  return staged;
}

std::string state_dict_mismatch(const FlatStateDict& from, const FlatStateDict& to, bool type_check) {
  for (const FlatEntry& entry : to.entries()) {
    if (!from.contains(entry.fqn)) {
      return fmt::format("copy_state_dict: destination entry '{}' is missing from the source", entry.fqn);
    }
  }
  for (const FlatEntry& entry : from.entries()) {
    const FlatEntry* target = to.find(entry.fqn);
    if (target == nullptr) {
      return fmt::format("copy_state_dict: source entry '{}' is missing from the destination", entry.fqn);
    }
    if (entry.path != target->path) {
      return fmt::format("copy_state_dict: entry '{}' has a different structure in source and destination", entry.fqn);
    }
    const bool src_tensor = entry.value.isTensor();
    const bool dst_tensor = target->value.isTensor();
    if (src_tensor != dst_tensor || (!src_tensor && type_check && entry.value.tagKind() != target->value.tagKind())) {
      return fmt::format("copy_state_dict: entry '{}' is a {} in the source but a {} in the destination", entry.fqn,
                         leaf_kind(entry.value), leaf_kind(target->value));
    }
    if (src_tensor) {
      const at::Tensor& s = entry.value.toTensor();
      const at::Tensor& d = target->value.toTensor();
      if (!s.defined() || !d.defined()) {
        return fmt::format("copy_state_dict: entry '{}' is an undefined tensor", entry.fqn);
      }
      if (s.sizes() != d.sizes() || s.scalar_type() != d.scalar_type()) {
        return fmt::format("copy_state_dict: entry '{}' is {} in the source but {} in the destination", entry.fqn,
                           describe_tensor(s), describe_tensor(d));
      }
    }
  }
  return {};
}

std::string state_dict_mismatch(const StateDict& src, const StateDict& dst, bool type_check) {
  return state_dict_mismatch(flatten_state_dict(src), flatten_state_dict(dst), type_check);
}

FlatStateDict copy_state_dict(const FlatStateDict& src, const FlatStateDict& dst, bool non_blocking, bool type_check) {
  // Validate everything first, so that a mismatch copies nothing.
  const std::string mismatch = state_dict_mismatch(src, dst, type_check);
  if (!mismatch.empty()) throw InvalidArgument(mismatch);
  FlatStateDict copied;
  for (const FlatEntry& entry : src.entries()) {
    const FlatEntry& target = dst.at(entry.fqn);
    if (!entry.value.isTensor()) {
      copied.add(FlatEntry{entry.fqn, entry.path, copy_leaf(entry.value)});
      continue;
    }
    at::Tensor tensor = target.value.toTensor();
    tensor.copy_(entry.value.toTensor(), non_blocking);
    copied.add(FlatEntry{target.fqn, target.path, std::move(tensor)});
  }
  return copied;
}

void copy_state_dict(const StateDict& src, StateDict& dst, bool non_blocking, bool type_check) {
  const FlatStateDict copied =
      copy_state_dict(flatten_state_dict(src), flatten_state_dict(dst), non_blocking, type_check);
  for (const FlatEntry& entry : copied.entries()) {
    if (!entry.value.isTensor()) replace_leaf(dst, entry.path, entry.value);
  }
}

}  // namespace stowage
