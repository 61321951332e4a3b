#include <stowage/error.h>
#include <stowage/state/destination.h>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace stowage {
namespace {

// Whether two elements of `tensor` (strided, non-empty) share memory.
bool elements_overlap(const at::Tensor& tensor) {
  switch (at::has_internal_overlap(tensor)) {
    case at::MemOverlap::Yes:
      return true;
    case at::MemOverlap::No:
      return false;
    case at::MemOverlap::TooHard:
      break;
  }
  // Dimensions by stride: if each one's stride passes the reach of those below it, the
  // elements are distinct (the usual case: permuted or sliced views).
  std::vector<int64_t> dims(tensor.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::sort(dims.begin(), dims.end(), [&](int64_t a, int64_t b) { return tensor.stride(a) < tensor.stride(b); });
  int64_t reach = 1;
  bool disjoint = true;
  for (const int64_t d : dims) {
    if (tensor.size(d) == 1) continue;
    disjoint = disjoint && tensor.stride(d) >= reach;
    reach += tensor.stride(d) * (tensor.size(d) - 1);
  }
  if (disjoint) return false;
  // Otherwise (rare, hand-made as_strided views) count the distinct element offsets.
  at::Tensor offsets = at::zeros({1}, at::kLong);
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    offsets = (offsets.unsqueeze(1) + at::arange(tensor.size(d), at::kLong) * tensor.stride(d)).flatten();
  }
  const at::Tensor sorted = std::get<0>(offsets.sort());
  return sorted.slice(0, 1).eq(sorted.slice(0, 0, -1)).any().item<bool>();
}

}  // namespace

void check_writable_destination(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) {
    throw InvalidArgument(fmt::format("{} is an undefined tensor", what));
  }
  if (tensor.layout() != c10::kStrided) {
    throw InvalidArgument(
        fmt::format("{} is a {} tensor; only dense tensors can be loaded into", what, c10::toString(tensor.layout())));
  }
  if (tensor.device().is_meta()) {
    throw InvalidArgument(fmt::format("{} is on the meta device, which holds no data to load into", what));
  }
  if (tensor.numel() == 0) return;
  if (tensor.is_inference() && !c10::InferenceMode::is_enabled()) {
    throw InvalidArgument(fmt::format(
        "{} is an inference tensor (made under InferenceMode), which cannot be written outside InferenceMode", what));
  }
  if (elements_overlap(tensor)) {
    throw InvalidArgument(fmt::format(
        "{} cannot be loaded into: its elements overlap in memory (an expanded or stride-0 view); pass a tensor "
        "with memory of its own (e.g. .contiguous())",
        what));
  }
}

}  // namespace stowage
