#pragma once

// checkpoint_sequential: checkpointing a chain of modules in segments, the counterpart
// of torch.utils.checkpoint.checkpoint_sequential.
//
// The modules are cut into `segments` runs the way PyTorch cuts them: each of the
// first segments-1 runs holds size/segments modules and is checkpointed; the last run
// holds the rest (including the remainder of the division) and runs plainly, since
// backward starts right after it and recomputing it would save nothing. segments = 1
// therefore checkpoints nothing. Each module must map one tensor to one tensor. A module
// that modifies its input in place (e.g. an in-place activation) must not come first in
// a checkpointed segment: the segment's checkpoint raises RecomputationError, as
// checkpoint() does for any fn that modifies its input.

#include <stowage/activation/checkpoint.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <vector>

namespace stowage::activation {

// Throws InvalidArgument when segments < 1 or segments > modules.size().
at::Tensor checkpoint_sequential(const std::vector<torch::nn::AnyModule>& modules, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options = {});

// The children of `sequential`, in order, as above.
at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options = {});

}  // namespace stowage::activation
