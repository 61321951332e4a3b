// The recomputation in backward leaves buffers as one forward leaves them: BatchNorm's
// running statistics and counter end bit-identical to a run without checkpointing, with
// momentum and with cumulative averaging, unless PyTorch's behaviour is asked for.

#include <stowage/activation/checkpoint.h>
#include <stowage/activation/sequential.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace stowage::activation {
namespace {

struct BatchNormCase {
  std::string name;
  bool two_d;
  c10::optional<double> momentum;  // none: cumulative averaging
};

torch::nn::Sequential batch_norm_model(const BatchNormCase& c) {
  torch::manual_seed(5);
  torch::nn::Sequential model;
  for (int i = 0; i < 3; ++i) {
    if (c.two_d) {
      model->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)));
      model->push_back(torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(4).momentum(c.momentum)));
    } else {
      model->push_back(torch::nn::Linear(8, 8));
      model->push_back(torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(8).momentum(c.momentum)));
    }
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

at::Tensor batch_for(const BatchNormCase& c, int step) {
  torch::manual_seed(100 + step);
  return c.two_d ? torch::randn({6, 4, 5, 5}) : torch::randn({16, 8});
}

torch::nn::Sequential copy_of(const torch::nn::Sequential& model) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
}

std::vector<at::Tensor> tensors_of(const torch::nn::Sequential& model) {
  std::vector<at::Tensor> tensors;
  for (const at::Tensor& buffer : model->buffers()) tensors.push_back(buffer.clone());
  for (const at::Tensor& parameter : model->parameters()) tensors.push_back(parameter.grad().clone());
  return tensors;
}

void expect_same_tensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

const std::vector<BatchNormCase> kBatchNormCases = {
    {"BatchNorm1d, momentum 0.1", false, 0.1},
    {"BatchNorm1d, cumulative averaging", false, c10::nullopt},
    {"BatchNorm2d, momentum 0.1", true, 0.1},
    {"BatchNorm2d, cumulative averaging", true, c10::nullopt},
};

TEST(CheckpointSequential, BatchNormBuffersEndAsAfterOnePlainForward) {
  for (const BatchNormCase& c : kBatchNormCases) {
    SCOPED_TRACE(c.name);
    torch::nn::Sequential plain = batch_norm_model(c);
    torch::nn::Sequential checkpointed = copy_of(plain);
    for (int step = 0; step < 3; ++step) {  // the counter grows: cumulative averaging changes its factor
      plain->forward(batch_for(c, step)).pow(2).sum().backward();
      checkpoint_sequential(checkpointed, 3, batch_for(c, step)).pow(2).sum().backward();
    }
    expect_same_tensors(tensors_of(plain), tensors_of(checkpointed));
  }
}

TEST(CheckpointSequential, KeepingTheRecomputedUpdatesIsPyTorchsBehaviour) {
  const BatchNormCase& c = kBatchNormCases.front();
  torch::nn::Sequential model = batch_norm_model(c);
  checkpoint_sequential(model, 3, batch_for(c, 0), CheckpointOptions().keep_recomputed_buffer_updates(true))
      .pow(2)
      .sum()
      .backward();
  // Blocks 0 and 1 are checkpointed and counted twice; the last segment runs plainly.
  EXPECT_EQ(model[1]->as<torch::nn::BatchNorm1d>()->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_EQ(model[4]->as<torch::nn::BatchNorm1d>()->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_EQ(model[7]->as<torch::nn::BatchNorm1d>()->num_batches_tracked.item<int64_t>(), 1);
}

TEST(Checkpoint, BuffersListedInTheOptionsEndAsAfterOnePlainForward) {
  torch::manual_seed(2);
  torch::nn::BatchNorm1d plain(8);
  torch::nn::BatchNorm1d checkpointed(8);
  const at::Tensor x = torch::randn({16, 8});
  plain->forward(x).pow(2).sum().backward();
  const auto fn = [&](const at::Tensor& input) { return checkpointed->forward(input); };
  checkpoint(fn, x, CheckpointOptions().buffers(checkpointed->buffers())).pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(plain->running_mean, checkpointed->running_mean));
  EXPECT_TRUE(torch::equal(plain->running_var, checkpointed->running_var));
  EXPECT_EQ(checkpointed->num_batches_tracked.item<int64_t>(), 1);

  torch::nn::BatchNorm1d unlisted(8);
  checkpoint([&](const at::Tensor& input) { return unlisted->forward(input); }, x).pow(2).sum().backward();
  EXPECT_EQ(unlisted->num_batches_tracked.item<int64_t>(), 2);  // checkpoint cannot see what fn captures
}

}  // namespace
}  // namespace stowage::activation
