// apply_activation_checkpointing(): Sequential children and CheckpointSites run under
// checkpoint (their forward runs again in backward), with gradients and buffers as in a
// plain run and names unchanged; what cannot be wrapped is refused before anything changes.

#include <stowage/activation/policy.h>

#include "activation/gradients.h"
#include "test_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace stowage::activation {
namespace {

using ::testing::ElementsAre;
using testing::expect_bit_identical;
using ::testing::HasSubstr;

torch::TensorOptions on_device() {
  return torch::TensorOptions().device(testing::test_device());
}

// A Linear that counts its forward calls: a checkpointed one runs twice per step.
class CountingLinearImpl : public torch::nn::Module {
 public:
  CountingLinearImpl(int64_t in, int64_t out) : linear_(register_module("linear", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) {
    ++calls;
    return linear_->forward(x);
  }
  int calls = 0;

 private:
  torch::nn::Linear linear_;
};
TORCH_MODULE(CountingLinear);

// A module that runs its hidden layer through a CheckpointSite, and its output layer as a
// plain member.
class SiteModelImpl : public torch::nn::Module {
 public:
  SiteModelImpl()
      : hidden_(register_module("hidden", torch::nn::Linear(8, 32))),
        core_(register_module("core", CheckpointSite())),
        out_(register_module("out", torch::nn::Linear(32, 8))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = core_->forward(
        [this](const at::Tensor& in) {
          ++core_calls;
          return torch::gelu(hidden_->forward(in));
        },
        x);
    return out_->forward(h);
  }
  int core_calls = 0;

 private:
  torch::nn::Linear hidden_;
  CheckpointSite core_;
  torch::nn::Linear out_;
};
TORCH_MODULE(SiteModel);

torch::nn::Sequential counting_mlp() {
  torch::manual_seed(7);
  torch::nn::Sequential model(CountingLinear(8, 32), torch::nn::GELU(), CountingLinear(32, 32), torch::nn::GELU(),
                              CountingLinear(32, 8));
  model->to(testing::test_device());
  return model;
}

// The input's gradient and every parameter's, after one backward of `model` on `x`.
template <typename ModuleHolder>
std::vector<at::Tensor> gradients(ModuleHolder& model, const at::Tensor& x) {
  return testing::gradients_after(*model, x, [&](const at::Tensor& in) { return model->forward(in).pow(2).sum(); });
}

std::vector<std::string> parameter_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) names.push_back(item.key());
  return names;
}

TEST(ApplyActivationCheckpointing, WrapsSequentialChildrenInPlaceWithTheSameGradientsAndNames) {
  const at::Tensor x = torch::randn({4, 8}, on_device());
  torch::nn::Sequential plain = counting_mlp();
  torch::nn::Sequential model = counting_mlp();
  const std::vector<std::string> names_before = parameter_names(*model);

  const std::vector<std::shared_ptr<CountingLinearImpl>> children{
      model->ptr<CountingLinearImpl>(0), model->ptr<CountingLinearImpl>(2), model->ptr<CountingLinearImpl>(4)};
  EXPECT_THAT(apply_activation_checkpointing(*model, module_type<CountingLinearImpl>()), ElementsAre("0", "2", "4"));
  EXPECT_EQ(parameter_names(*model), names_before);
  expect_bit_identical(gradients(model, x), gradients(plain, x));
  // Each wrapped child ran again in backward; the Sequential's entry is its wrapper.
  for (size_t i = 0; i < children.size(); ++i) {
    EXPECT_EQ(children[i]->calls, 2) << "child " << 2 * i;
    EXPECT_EQ(model[2 * i]->as<CheckpointWrapperImpl>()->wrapped(), children[i]) << "child " << 2 * i;
    EXPECT_EQ(plain[2 * i]->as<CountingLinearImpl>()->calls, 1) << "child " << 2 * i;
  }
}

TEST(ApplyActivationCheckpointing, WrappingTwiceChangesNothingMore) {
  torch::nn::Sequential model = counting_mlp();
  const std::shared_ptr<CountingLinearImpl> child = model->ptr<CountingLinearImpl>(2);
  EXPECT_THAT(apply_activation_checkpointing(*model, module_name("2")), ElementsAre("2"));
  EXPECT_TRUE(apply_activation_checkpointing(*model, module_name("2")).empty());
  model->forward(torch::randn({2, 8}, on_device())).sum().backward();
  EXPECT_EQ(child->calls, 2);  // checkpointed once, not twice
}

TEST(ApplyActivationCheckpointing, EnablesACheckpointSiteSoThatOnlyItsComputationIsRecomputed) {
  const at::Tensor x = torch::randn({4, 8}, on_device());
  torch::manual_seed(3);
  SiteModel plain;
  torch::manual_seed(3);
  SiteModel model;
  plain->to(testing::test_device());
  model->to(testing::test_device());
  EXPECT_THAT(apply_activation_checkpointing(*model, module_name(".*core")), ElementsAre("core"));
  expect_bit_identical(gradients(model, x), gradients(plain, x));
  EXPECT_EQ(model->core_calls, 2);
  EXPECT_EQ(plain->core_calls, 1);
}

TEST(ApplyActivationCheckpointing, AModuleItsParentCallsAsAMemberIsRefusedAndNothingChanges) {
  torch::nn::Sequential model(CountingLinear(8, 8), SiteModel());
  model->to(testing::test_device());
  const std::shared_ptr<CountingLinearImpl> first = model->ptr<CountingLinearImpl>(0);
  try {
    // "0" comes first and could be wrapped; "1.out" cannot.
    apply_activation_checkpointing(*model, module_name(R"(0|1\.out)"));
    ADD_FAILURE() << "wrapped a member";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'1.out'"));
    EXPECT_THAT(e.what(), HasSubstr("torch::nn::Linear"));
    EXPECT_THAT(e.what(), HasSubstr("calls it through a member"));
  }
  model->forward(torch::randn({2, 8}, on_device())).sum().backward();
  EXPECT_EQ(first->calls, 1);
}

TEST(ApplyActivationCheckpointing, AChildOfAModuleListIsRefused) {
  torch::nn::ModuleList list(torch::nn::Linear(4, 4));
  EXPECT_THROW(
      {
        try {
          apply_activation_checkpointing(*list, module_type<torch::nn::LinearImpl>());
        } catch (const InvalidArgument& e) {
          EXPECT_THAT(e.what(), HasSubstr("'0' (torch::nn::LinearImpl)"));
          EXPECT_THAT(e.what(), HasSubstr("ModuleList"));
          throw;
        }
      },
      InvalidArgument);
}

TEST(ApplyActivationCheckpointing, ASelectorThatPicksNothingWarnsAndChangesNothing) {
  torch::nn::Sequential model = counting_mlp();
  const std::shared_ptr<CountingLinearImpl> first = model->ptr<CountingLinearImpl>(0);
  ::testing::internal::CaptureStderr();
  const std::vector<std::string> names = apply_activation_checkpointing(*model, module_name("nothing"));
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(names.empty());
  EXPECT_THAT(warnings, HasSubstr("picks none of the"));
  model->forward(torch::randn({2, 8}, on_device())).sum().backward();
  EXPECT_EQ(first->calls, 1);
}

// Against a plain forward on the CPU: a device that dropped a buffer's update (sim once
// dropped batch norm's running statistics) would pass a comparison with itself.
TEST(ApplyActivationCheckpointing, BuffersOfAWrappedModuleEndAsAfterOnePlainForwardOnTheCpu) {
  torch::manual_seed(5);
  torch::nn::Sequential plain(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8));
  torch::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8));
  model->to(testing::test_device());
  apply_activation_checkpointing(*model, module_type<torch::nn::BatchNorm1dImpl>());
  const at::Tensor x = torch::randn({16, 8}) + 1;
  plain->forward(x).sum().backward();
  model->forward(x.to(testing::test_device())).sum().backward();
  const bool exact = !testing::test_device().is_cuda();  // a GPU's kernels round differently
  const auto buffers = model->named_buffers();
  for (const auto& item : plain->named_buffers()) {
    const at::Tensor buffer = buffers[item.key()].cpu();
    EXPECT_TRUE(exact ? torch::equal(buffer, item.value()) : torch::allclose(buffer, item.value(), 1e-4, 1e-5))
        << item.key() << ": " << buffer << " against " << item.value();
  }
  const at::Tensor running_mean = buffers["1.running_mean"].cpu();
  EXPECT_FALSE(torch::equal(running_mean, torch::zeros_like(running_mean))) << "the step did not move it";
  EXPECT_EQ(buffers["1.num_batches_tracked"].item<int64_t>(), 1);
}

TEST(ApplyActivationCheckpointing, ABadSelectorIsRefused) {
  torch::nn::Sequential model = counting_mlp();
  EXPECT_THROW(apply_activation_checkpointing(*model, ModuleSelector()), InvalidArgument);
  EXPECT_THROW(module_name("("), InvalidArgument);
  // A wrapped Sequential is not cloned into one that would run the original children.
  apply_activation_checkpointing(*model, module_name("0"));
  EXPECT_THROW(model->clone(), c10::Error);
}

}  // namespace
}  // namespace stowage::activation
