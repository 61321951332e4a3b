#include "dcp/copy_before_return.h"

#include <stowage/state/stateful.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace stowage::dcp::detail {
namespace {

using Replacement = std::pair<ObjectPath, c10::IValue>;
using Replacements = std::vector<Replacement>;

// The names of what the Statefuls of `state` say their forward writes.
std::unordered_set<std::string> written_in_forward(const StateDict& state) {
  std::unordered_set<std::string> names;
  for (const auto& item : state) {
    if (const c10::intrusive_ptr<Stateful> object = as_stateful(item.value())) {
      for (ObjectPath& path : object->entries_written_in_forward()) {
        path.insert(path.begin(), item.key());
        names.insert(path_to_string(path));
      }
    }
  }
  return names;
}

bool is_named_by(const std::string& fqn, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [&fqn](const std::string& name) {
    return fqn == name ||
           (fqn.size() > name.size() && fqn.compare(0, name.size(), name) == 0 && fqn[name.size()] == '.');
  });
}

bool packable(const at::Tensor& tensor) {
  return tensor.device().is_cpu() && tensor.is_contiguous() && !tensor.is_conj() && !tensor.is_neg();
}

constexpr size_t kAlignment = 64;

size_t aligned(size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Copies of `tensors`, taken now: the packable ones into one CPU buffer they share, the
// others cloned.
std::vector<at::Tensor> copies_of(const std::vector<at::Tensor>& tensors) {
  size_t packed_bytes = 0;
  for (const at::Tensor& tensor : tensors) {
    if (packable(tensor)) packed_bytes += aligned(tensor.nbytes());
  }
  const at::Tensor buffer = at::empty({static_cast<int64_t>(packed_bytes)}, at::kByte);
  auto* next = static_cast<char*>(buffer.data_ptr());
  std::vector<at::Tensor> copies;
  copies.reserve(tensors.size());
  const at::NoGradGuard no_grad;
  for (const at::Tensor& tensor : tensors) {
    if (!packable(tensor)) {
      copies.push_back(tensor.clone());
      continue;
    }
    if (tensor.nbytes() > 0) std::memcpy(next, tensor.data_ptr(), tensor.nbytes());
    copies.push_back(at::from_blob(
        next, tensor.sizes(), tensor.strides(), [buffer](void*) {}, tensor.options()));
    next += aligned(tensor.nbytes());
  }
  return copies;
}

// `container` (a dict or a list) with the leaves of [begin, end) replaced, their paths
// taken from `depth` on: the containers on those paths are copied, the rest shared.
// REQUIRES: [begin, end) in the order flatten_state_dict gives, so that the entries
// below one child are consecutive.
c10::IValue with_replaced(const c10::IValue& container, Replacements::const_iterator begin,
                          Replacements::const_iterator end, size_t depth) {
  c10::IValue copy = container.isGenericDict() ? c10::IValue(container.toGenericDict().copy())
                                               : c10::IValue(container.toList().copy());
  for (auto group = begin; group != end;) {
    const PathElement& step = group->first[depth];
    auto group_end = std::find_if(group, end, [&](const Replacement& r) { return r.first[depth] != step; });
    if (group->first.size() == depth + 1) {
      TORCH_INTERNAL_ASSERT(group_end == group + 1, "copy_before_return: two replacements of one leaf");
    }
    const auto child = [&](const c10::IValue& parent) {
      return parent.isGenericDict() ? parent.toGenericDict().at(std::get<std::string>(step))
                                    : parent.toList().get(std::get<int64_t>(step));
    };
    const c10::IValue value =
        group->first.size() == depth + 1 ? group->second : with_replaced(child(container), group, group_end, depth + 1);
    if (copy.isGenericDict()) {
      copy.toGenericDict().insert_or_assign(std::get<std::string>(step), value);
    } else {
      copy.toList().set(std::get<int64_t>(step), value);
    }
    group = group_end;
  }
  return copy;
}

}  // namespace

StateDict copy_before_return(const StateDict& state, const StateDict& plain, const FlatStateDict& flat,
                             const AsyncSaveOptions& options) {
  const std::unordered_set<std::string> forward =
      options.copy_forward_state_before_return() ? written_in_forward(state) : std::unordered_set<std::string>();
  std::vector<const FlatEntry*> copied;
  std::vector<at::Tensor> tensors;
  for (const FlatEntry& entry : flat.entries()) {
    if (entry.value.isTensor() &&
        (forward.count(entry.fqn) != 0 || is_named_by(entry.fqn, options.copy_before_return()))) {
      copied.push_back(&entry);
      tensors.push_back(entry.value.toTensor());
    }
  }
  if (copied.empty()) return plain;
  std::vector<at::Tensor> copies = copies_of(tensors);
  Replacements replacements;
  replacements.reserve(copied.size());
  for (size_t i = 0; i < copied.size(); ++i) replacements.emplace_back(copied[i]->path, std::move(copies[i]));
  return StateDict(
      with_replaced(c10::IValue(plain.dict()), replacements.begin(), replacements.end(), 0).toGenericDict());
}

}  // namespace stowage::dcp::detail
