#pragma once

// The buffers a checkpointed module updates in its forward, added to the options that put
// them back after the recomputation (CheckpointOptions::buffers).

#include <stowage/activation/checkpoint.h>

#include <torch/nn/module.h>

namespace stowage::activation {

// `options` with the buffers of `module` and its descendants added, unless the options
// keep the recomputation's updates.
CheckpointOptions with_buffers_of(const torch::nn::Module& module, CheckpointOptions options);

}  // namespace stowage::activation
