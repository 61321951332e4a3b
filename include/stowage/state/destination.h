#pragma once

// Whether a tensor can be filled in place, checked before a load writes anything (a
// load that would fail halfway through its destinations fails before the first).

#include <ATen/core/Tensor.h>

#include <string>

namespace stowage {

// Throws stowage::InvalidArgument, starting with `what` (e.g. "load: entry 'w'"), unless
// `tensor` can be written in place: it must be defined, dense (strided), not on the meta
// device, no two of its elements may share memory (an expanded or stride-0 view), and
// it must not be an inference tensor outside InferenceMode. An empty tensor can always
// be filled (nothing is written).
void check_writable_destination(const at::Tensor& tensor, const std::string& what);

}  // namespace stowage
