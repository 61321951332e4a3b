#include <stowage/dcp/saveable_state.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace stowage::dcp {
namespace {

// What kind of tensor an error names (c10::toString of a Layout would print a whole
// TensorOptions).
std::string kind_of(const at::Tensor& tensor) {
  if (tensor.is_quantized()) return "quantized";
  std::ostringstream layout;
  layout << tensor.layout();
  return layout.str();
}

// Throws InvalidArgument naming `fqn` unless `tensor` can be saved.
void check_saveable_tensor(const std::string& fqn, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    throw InvalidArgument(fmt::format("checkpoint entry '{}' is an undefined tensor", fqn));
  }
  if (tensor.layout() != c10::kStrided || tensor.is_quantized()) {
    throw InvalidArgument(
        fmt::format("checkpoint entry '{}' is a {} tensor; only dense tensors can be saved", fqn, kind_of(tensor)));
  }
}

// A leaf as an error names it.
std::string describe_leaf(const FlatEntry* entry) {
  if (entry == nullptr) return "nothing";
  return fmt::format("'{}' ({})", entry->fqn, entry->value.isTensor() ? "a tensor" : entry->value.tagKind());
}

void check_saveable_leaves(const FlatStateDict& leaves) {
  for (const FlatEntry& entry : leaves.entries()) {
    if (entry.value.isTensor()) check_saveable_tensor(entry.fqn, entry.value.toTensor());
  }
}

}  // namespace

SaveableState::SaveableState(const StateDict& state) {
  StateDict resolved;  // a shallow copy, each top-level Stateful replaced by its state_dict()
  for (const auto& item : state) {
    const c10::intrusive_ptr<Stateful> object = as_stateful(item.value());
    if (!object) {
      resolved.insert(item.key(), item.value());
      continue;
    }
    resolved.insert(item.key(), c10::IValue(object->state_dict()));
    for (ObjectPath& path : object->entries_written_in_forward()) {
      path.insert(path.begin(), item.key());
      written_in_forward_.insert(path_to_string(path));
    }
  }
  UnshardedState local = unshard_state_dict(resolved);
  leaves_ = flatten_state_dict(local.state);
  layouts_ = std::move(local.layouts);
  check_saveable_leaves(leaves_);
}

SaveableState SaveableState::with_leaves(FlatStateDict replacements) const {
  const std::vector<FlatEntry>& mine = leaves_.entries();
  const std::vector<FlatEntry>& theirs = replacements.entries();
  for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
    const FlatEntry* want = i < mine.size() ? &mine[i] : nullptr;
    const FlatEntry* got = i < theirs.size() ? &theirs[i] : nullptr;
    if (want == nullptr || got == nullptr || want->fqn != got->fqn || want->path != got->path ||
        want->value.isTensor() != got->value.isTensor()) {
      throw InvalidArgument(
          fmt::format("a snapshot of the saved state differs from it at leaf {}: {} where the state has {}", i,
                      describe_leaf(got), describe_leaf(want)));
    }
  }
  check_saveable_leaves(replacements);
  SaveableState replaced;
  replaced.leaves_ = std::move(replacements);
  replaced.layouts_ = layouts_;
  replaced.written_in_forward_ = written_in_forward_;
  return replaced;
}

}  // namespace stowage::dcp
