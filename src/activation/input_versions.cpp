#include "activation/input_versions.h"

#include <stowage/activation/checkpoint.h>

#include "activation/nested_tensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

namespace stowage::activation {

InputVersions::InputVersions(const std::vector<c10::IValue>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool nested = !inputs[i].isTensor();
    for_each_tensor(inputs[i], [&](const at::Tensor& tensor) {
      const c10::VariableVersion& counter = tensor.unsafeGetTensorImpl()->version_counter();
      if (counter.enabled()) {
        watched_.push_back({i, nested, tensor.sizes().vec(), counter, counter.current_version()});
      }
    });
  }
}

void InputVersions::expect_unchanged(Moment moment) const {
  for (const Watched& watched : watched_) {
    if (watched.counter.current_version() == watched.version) {
      continue;
    }
    const std::string shape = fmt::format("shape [{}]", fmt::join(watched.sizes, ", "));
    const std::string tensor = watched.nested ? fmt::format("a tensor ({}) inside input {}", shape, watched.input)
                                              : fmt::format("input {} ({})", watched.input, shape);
    switch (moment) {
      case Moment::kAfterForward:
        throw RecomputationError(fmt::format(
            "checkpoint: fn modified {} in place; the recomputation in backward would run fn on the modified "
            "value and modify it again, giving wrong gradients. Modify a copy inside fn (e.g. clone() it first), "
            "or run fn without checkpoint",
            tensor));
      case Moment::kBeforeRecomputation:
        throw RecomputationError(
            fmt::format("checkpoint: {} was modified in place after the forward; backward would recompute fn from the "
                        "modified value and give wrong gradients. Modify it only after backward, or modify a copy",
                        tensor));
      case Moment::kAfterRecomputation:
        throw RecomputationError(fmt::format(
            "checkpoint: fn modified {} in place during the recomputation in backward (it did not in the "
            "forward); the caller's tensor now differs from what the forward saw. fn must not modify its inputs",
            tensor));
    }
  }
}

}  // namespace stowage::activation
