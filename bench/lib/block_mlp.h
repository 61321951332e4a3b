#pragma once

// The deep MLP of the activation, memory-timeline and gradient-synchronisation benchmarks:
// `blocks` blocks of Linear(width, width) + GELU. Each block is a module of its own, so
// that checkpoint_sequential cuts the model between blocks (a Sequential cannot hold a
// Sequential).

#include <torch/torch.h>

#include <cstdint>

namespace stowage::bench {

struct MlpBlockImpl : torch::nn::Module {
  explicit MlpBlockImpl(int64_t width);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear linear;
};
TORCH_MODULE(MlpBlock);

// REQUIRES: blocks >= 1, width >= 1 (the benchmarks check their configs first).
torch::nn::Sequential make_block_mlp(int64_t blocks, int64_t width);

}  // namespace stowage::bench
