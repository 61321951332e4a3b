#include "dcp/copy_before_return.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace stowage::dcp::detail {
namespace {

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

}  // namespace

SaveableState copy_before_return(const SaveableState& state, const AsyncSaveOptions& options) {
  const auto copied = [&](const FlatEntry& entry) {
    return entry.value.isTensor() &&
           ((options.copy_forward_state_before_return() && state.written_in_forward().count(entry.fqn) != 0) ||
            is_named_by(entry.fqn, options.copy_before_return()));
  };
  std::vector<at::Tensor> tensors;
  for (const FlatEntry& entry : state.leaves().entries()) {
    if (copied(entry)) tensors.push_back(entry.value.toTensor());
  }
  if (tensors.empty()) return state;
  std::vector<at::Tensor> copies = copies_of(tensors);
  FlatStateDict leaves;
  size_t next_copy = 0;
  for (const FlatEntry& entry : state.leaves().entries()) {
    leaves.add(copied(entry) ? FlatEntry{entry.fqn, entry.path, std::move(copies[next_copy++])} : entry);
  }
  return state.with_leaves(std::move(leaves));
}

}  // namespace stowage::dcp::detail
