#pragma once

// torch::optim::AdamW for fp32 parameters on the host, in one fused pass per parameter.
//
// LibTorch's AdamW::step runs about ten tensor operations per parameter, each a pass over
// memory; FusedAdamW reads the parameter, its gradient and its moments once and writes
// them once (28 bytes an element without amsgrad), vectorised for the CPU's widest ATen
// capability and split over ATen's intra-op threads. Everything else is AdamW's: the
// options (AdamWOptions, per group), the state (AdamWParamState, so state dicts,
// serialization and stowage's checkpoints take it as AdamW's), and the update's operations
// per element, in the same order: bit for bit AdamW's on Debian's LibTorch 1.13, within 4
// fp32 epsilons of each element's scale on PyTorch 2.11's, whose fp32 sqrt is not always
// correctly rounded (tests/optim/fused_adamw_test.cpp). A SwapOptimizer over a FusedAdamW
// updates host parameters in the same pass, bit for bit FusedAdamW's; over LibTorch's
// AdamW it runs LibTorch's operations, bit for bit AdamW's.

#include <torch/optim/adamw.h>

namespace stowage::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // REQUIRES: each parameter that has a gradient is a contiguous fp32 CPU tensor and its
  // gradient a dense fp32 CPU tensor of its shape; otherwise InvalidArgument names the
  // parameter (group and index) and what it is, before any parameter is updated.
  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace stowage::optim
