#pragma once

// Detecting in-place modifications of a checkpointed function's inputs.

#include <ATen/core/ivalue.h>
#include <c10/core/TensorImpl.h>

#include <cstdint>
#include <vector>

namespace stowage::activation {

// The version counters of the tensors a checkpointed fn is given: its top-level tensor
// inputs and the tensors inside its container inputs. The recomputation in backward
// runs fn on these same tensors again, so it reproduces the forward only if none of
// them was modified in place since the forward began: by fn itself (the recomputation
// would apply the modification a second time, to the modified value) or by the caller
// before backward. Either would give gradients computed at other values, silently;
// every in-place operation bumps the tensor's version counter, which tells.
class InputVersions {
 public:
  // When a check is made, which decides what the error says happened.
  enum class Moment {
    kAfterForward,         // fn has just run in the forward
    kBeforeRecomputation,  // backward is about to run fn again
    kAfterRecomputation,   // fn has just run again in backward
  };

  // Records the current version of every tensor in `inputs`. Tensors without a version
  // counter (inference tensors) cannot be modified outside inference mode and are skipped.
  explicit InputVersions(const std::vector<c10::IValue>& inputs);

  // Throws RecomputationError naming the first tensor whose version differs from the one
  // recorded at construction.
  void expect_unchanged(Moment moment) const;

 private:
  struct Watched {
    size_t input;  // the position in fn's inputs
    bool nested;   // inside a container input, not the input itself
    std::vector<int64_t> sizes;
    c10::VariableVersion counter;  // shares the tensor's counter, not its data
    uint32_t version;
  };
  std::vector<Watched> watched_;
};

}  // namespace stowage::activation
