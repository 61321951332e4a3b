#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace stowage::dcp::detail {

// Throws InvalidArgument naming `fqn` if `tensor` cannot be saved: undefined, or not a
// dense (strided, unquantized) tensor. Save plans it; async_save and the stagers check
// it before staging, so that every path gives the same error.
void check_saveable_tensor(const std::string& fqn, const at::Tensor& tensor);

}  // namespace stowage::dcp::detail
