#pragma once

// Walking the tensors inside a checkpointed function's inputs and outputs.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <functional>

namespace stowage::activation {

// Calls `visit` on every defined tensor in `value`: the value itself when it is one,
// else those inside its lists, tuples and dicts (keys and values), recursively, as
// PyTorch's tree_map searches them.
void for_each_tensor(const c10::IValue& value, const std::function<void(const at::Tensor&)>& visit);

}  // namespace stowage::activation
