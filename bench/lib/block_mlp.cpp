#include "block_mlp.h"

namespace stowage::bench {

MlpBlockImpl::MlpBlockImpl(int64_t width) : linear(register_module("linear", torch::nn::Linear(width, width))) {}

at::Tensor MlpBlockImpl::forward(const at::Tensor& x) {
  return torch::gelu(linear->forward(x));
}

torch::nn::Sequential make_block_mlp(int64_t blocks, int64_t width) {
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) model->push_back(MlpBlock(width));
  return model;
}

}  // namespace stowage::bench
