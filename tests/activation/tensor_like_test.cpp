// torch.overrides.is_tensor_like's docstring examples (its upstream doctests) and the
// cases checked on 1.13, translated to C++ values and types.

#include <stowage/activation/tensor_like.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace stowage::activation {

// A class that opts in, as a Python class defining __torch_function__ does.
struct TensorProxy {
  at::Tensor wrapped;
};
template <>
struct TensorLikeTraits<TensorProxy> : std::true_type {};

namespace {

// "class SubTensor(torch.Tensor)": a C++ class derived from the tensor type.
struct SubTensor : at::Tensor {
  using at::Tensor::Tensor;
  explicit SubTensor(const at::Tensor& t) : at::Tensor(t) {}
};

struct NotATensor {};

TEST(IsTensorLike, TensorOnTheBuildsDeviceIsTensorLike) {
  // Seed 001: is_tensor_like is True for a tensor on the device (CPU on this build).
  const c10::Device device = torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  const at::Tensor t = torch::randn({2, 3}, torch::TensorOptions().device(device));
  EXPECT_TRUE(is_tensor_like(t));
  EXPECT_TRUE(is_tensor_like(c10::IValue(t)));
  EXPECT_TRUE(is_tensor_like(torch::randn({2}).requires_grad_()));  // a trainable tensor, Python's Parameter
}

TEST(IsTensorLike, DocstringExamples) {
  EXPECT_TRUE(is_tensor_like(SubTensor(torch::ones({1}))));    // Tensor subclass instance: True
  EXPECT_FALSE(is_tensor_like(6));                             // 6: False
  EXPECT_FALSE(is_tensor_like(c10::IValue()));                 // None: False
  EXPECT_FALSE(is_tensor_like(NotATensor{}));                  // a plain object: False
  EXPECT_TRUE(is_tensor_like(TensorProxy{torch::ones({1})}));  // defines the protocol: True
}

TEST(IsTensorLike, NoneSpelledAsUndefinedOrEmptyIsNotTensorLike) {
  EXPECT_FALSE(is_tensor_like(at::Tensor()));
  EXPECT_FALSE(is_tensor_like(c10::IValue(at::Tensor())));
  EXPECT_FALSE(is_tensor_like(c10::optional<at::Tensor>()));
  EXPECT_FALSE(is_tensor_like(c10::optional<at::Tensor>(at::Tensor())));
  EXPECT_TRUE(is_tensor_like(c10::optional<at::Tensor>(torch::ones({1}))));
  EXPECT_TRUE(is_tensor_like(c10::optional<TensorProxy>(TensorProxy{})));
}

TEST(IsTensorLike, ContainersAndScalarsAreNotTensorLike) {
  const std::vector<at::Tensor> tensors{torch::ones({1}), torch::zeros({1})};
  EXPECT_FALSE(is_tensor_like(tensors));
  EXPECT_FALSE(is_tensor_like(c10::IValue(c10::List<at::Tensor>(tensors))));
  EXPECT_FALSE(is_tensor_like(c10::IValue(c10::ivalue::Tuple::create({torch::ones({1})}))));
  EXPECT_FALSE(is_tensor_like(c10::IValue(4)));
  EXPECT_FALSE(is_tensor_like(c10::IValue(2.5)));
  EXPECT_FALSE(is_tensor_like(c10::IValue(std::string("bar"))));
  EXPECT_FALSE(is_tensor_like(std::string("bar")));
  EXPECT_FALSE(is_tensor_like(c10::Scalar(3)));
}

// dynamo's test_is_tensor_like: a function branching on is_tensor_like of its argument.
template <typename T>
c10::IValue tensor_or_scalar_branch(const T& value) {
  if (is_tensor_like(value)) {
    return c10::IValue(torch::ones({1}));
  }
  return c10::IValue(0);
}

TEST(IsTensorLike, BranchesOnTensorAndNumber) {
  EXPECT_TRUE(tensor_or_scalar_branch(torch::randn({3})).isTensor());
  EXPECT_TRUE(tensor_or_scalar_branch(4).isInt());
}

}  // namespace
}  // namespace stowage::activation
