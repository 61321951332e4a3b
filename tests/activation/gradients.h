#pragma once

// The gradients one backward gives, for tests that compare a checkpointed run with a
// plain one bit for bit.

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <functional>
#include <vector>

namespace stowage::testing {

// The input's gradient, then every parameter's of `model`, after the backward of
// loss(input), with input a leaf copy of `x`.
inline std::vector<at::Tensor> gradients_after(torch::nn::Module& model, const at::Tensor& x,
                                               const std::function<at::Tensor(const at::Tensor&)>& loss) {
  model.zero_grad();
  const at::Tensor input = x.detach().requires_grad_();
  loss(input).backward();
  std::vector<at::Tensor> grads{input.grad().cpu()};
  for (const at::Tensor& p : model.parameters()) grads.push_back(p.grad().cpu());
  return grads;
}

inline void expect_bit_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "gradient " << i;
}

}  // namespace stowage::testing
