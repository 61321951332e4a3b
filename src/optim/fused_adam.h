#pragma once

// adam_update (optim/adam_update.h) in one fused pass over host memory
// (optim/fused_adam_kernel.h), split over ATen's intra-op threads.

#include "optim/adam_update.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace stowage::optim::detail {

// Why fused_adam_update can't take `tensor` as the `what` ("gradient", "exp_avg", ...) of
// `param`, or "" when it can: every tensor it takes is a dense, contiguous fp32 CPU tensor
// of the parameter's shape.
std::string fused_adam_unsupported(const at::Tensor& tensor, const char* what, const at::Tensor& param);

// adam_update's update, fused: the same operations per element, within the ulp bound of
// optim/fused_adam_kernel.h. Writes nothing before it can finish (it allocates nothing).
// REQUIRES: fused_adam_unsupported is "" for each tensor it takes (max_exp_avg_sq only
// with amsgrad).
void fused_adam_update(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                       const at::Tensor& exp_avg_sq, const at::Tensor& max_exp_avg_sq, int64_t step,
                       const AdamHyperParams& hyper);

}  // namespace stowage::optim::detail
