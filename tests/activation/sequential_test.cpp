// checkpoint_sequential(): seed 001's validation, the upstream TestCheckpoint cases
// (test_checkpoint, _module_list, test_checkpoint_trigger) and the memory saving.

#include <stowage/activation/sequential.h>
#include <stowage/memory/accounting.h>

#include "test_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace stowage::activation {
namespace {

using ::testing::HasSubstr;

// The model of upstream's test_checkpoint: a 6-layer MLP.
torch::nn::Sequential six_layer_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(20, 50), torch::nn::ReLU(), torch::nn::Linear(50, 20),
                               torch::nn::ReLU(), torch::nn::Linear(20, 5), torch::nn::ReLU());
}

std::vector<at::Tensor> take_grads(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> grads;
  for (const auto& t : tensors) {
    grads.push_back(t.grad().clone());
    at::Tensor(t).mutable_grad().reset();
  }
  return grads;
}

// _check_checkpoint_sequential: output, input grad and every parameter grad equal the
// plain model's, here bit for bit.
template <typename Modules>
void expect_equal_to_plain_run(torch::nn::Sequential model, const Modules& modules, int64_t segments) {
  const at::Tensor x =
      torch::randn({1, 100, 20}, torch::TensorOptions().device(testing::test_device())).requires_grad_();
  std::vector<at::Tensor> leaves = model->parameters();
  leaves.push_back(x);

  const at::Tensor plain = model->forward(x);
  plain.sum().backward();
  const auto plain_grads = take_grads(leaves);

  const at::Tensor checkpointed = checkpoint_sequential(modules, segments, x);
  checkpointed.sum().backward();
  const auto checkpoint_grads = take_grads(leaves);

  EXPECT_TRUE(torch::equal(plain, checkpointed));
  ASSERT_EQ(plain_grads.size(), checkpoint_grads.size());
  for (size_t i = 0; i < plain_grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain_grads[i], checkpoint_grads[i])) << "gradient " << i;
  }
}

TEST(CheckpointSequential, LinearStackOnTheBuildsDeviceEqualsPlainRun) {
  // Seed 001: a device Linear stack with device inputs, forward + backward.
  torch::manual_seed(0);
  auto model = six_layer_mlp();
  model->to(testing::test_device());
  for (int64_t segments = 1; segments <= 6; ++segments) {
    SCOPED_TRACE("segments " + std::to_string(segments));
    expect_equal_to_plain_run(model, model, segments);
  }
}

TEST(CheckpointSequential, ListOfModulesEqualsPlainRun) {
  torch::manual_seed(1);
  auto model = six_layer_mlp();
  model->to(testing::test_device());
  const std::vector<torch::nn::AnyModule> modules(model->begin(), model->end());
  expect_equal_to_plain_run(model, modules, 2);
  expect_equal_to_plain_run(model, modules, 3);
}

// Counts its forward calls.
struct CounterImpl : torch::nn::Module {
  int64_t calls = 0;
  at::Tensor forward(const at::Tensor& x) {
    ++calls;
    return x * 2;
  }
};
TORCH_MODULE(Counter);

std::string call_counts(const std::vector<Counter>& counters) {
  std::string counts;
  for (const auto& counter : counters) {
    counts += std::to_string(counter->calls);
  }
  return counts;
}

// test_checkpoint_trigger: only the checkpointed segments run twice.
TEST(CheckpointSequential, OnlyCheckpointedSegmentsAreRecomputed) {
  const std::vector<std::pair<int64_t, std::string>> cases{
      {2, "2222211111"}, {3, "2222221111"}, {5, "2222222211"}, {10, "2222222221"}, {1, "1111111111"}};
  for (const auto& [segments, after_backward] : cases) {
    SCOPED_TRACE("segments " + std::to_string(segments));
    torch::nn::Sequential model;
    std::vector<Counter> counters;
    for (int i = 0; i < 10; ++i) {
      counters.emplace_back();
      model->push_back(counters.back());
    }
    const at::Tensor x = torch::randn({3, 4}).requires_grad_();
    const at::Tensor out = checkpoint_sequential(model, segments, x);
    EXPECT_EQ(call_counts(counters), "1111111111");
    out.sum().backward();
    EXPECT_EQ(call_counts(counters), after_backward);
    EXPECT_TRUE(torch::equal(x.grad(), torch::full({3, 4}, 1024.0)));
  }
}

TEST(CheckpointSequential, SegmentsOutOfRangeAreClearErrors) {
  torch::nn::Sequential model;
  for (int i = 0; i < 10; ++i) {
    model->push_back(Counter());
  }
  const at::Tensor x = torch::randn({2});
  try {
    checkpoint_sequential(model, 11, x);
    FAIL() << "more segments than modules must be rejected";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("segments (11) exceeds the number of modules (10)"));
  }
  for (const int64_t segments : {0, -3}) {
    try {
      checkpoint_sequential(model, segments, x);
      FAIL() << "segments " << segments << " must be rejected";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("segments must be at least 1, got " + std::to_string(segments)));
    }
  }
  EXPECT_THROW(checkpoint_sequential(std::vector<torch::nn::AnyModule>{}, 1, x), InvalidArgument);
  EXPECT_THROW(checkpoint_sequential(model, 2, at::Tensor()), InvalidArgument);
}

// A deep MLP whose activations dominate memory.
torch::nn::Sequential deep_mlp(int64_t blocks, int64_t width) {
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::GELU());
  }
  return model;
}

// Peak bytes the CPU allocator holds during one forward + backward.
template <typename Forward>
int64_t step_peak_bytes(const at::Tensor& x, Forward&& forward) {
  memory::reset_peak_memory_stats();
  forward(x).sum().backward();
  return memory::max_memory_allocated();
}

// A checkpointed segment whose first module modifies the segment's input in place
// would modify it again in the recomputation: refused, as for checkpoint().
TEST(CheckpointSequential, ASegmentModifyingItsInputInPlaceIsARecomputationError) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Functional([](const at::Tensor& x) { return x.add_(1); }),
                              torch::nn::Linear(6, 6), torch::nn::Tanh(), torch::nn::Linear(6, 2));
  const at::Tensor original = torch::randn({5, 6});
  at::Tensor input = original.clone();
  try {
    checkpoint_sequential(model, 2, input);
    FAIL() << "the segment's in-place modification of its input must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("fn modified input 0 (shape [5, 6]) in place"));
  }
  EXPECT_TRUE(torch::equal(input, original + 1));
}

TEST(CheckpointSequential, PeakMemoryOfADeepMlpIsBelowThePlainRun) {
  memory::enable_accounting();
  torch::manual_seed(2);
  const int64_t blocks = 16;
  auto model = deep_mlp(blocks, 64);
  const at::Tensor x = torch::randn({1024, 64});
  // Gradients exist before each measured step, so both runs start from the same bytes.
  model->forward(x).sum().backward();

  const int64_t plain = step_peak_bytes(x, [&](const at::Tensor& in) { return model->forward(in); });
  const int64_t checkpointed =
      step_peak_bytes(x, [&](const at::Tensor& in) { return checkpoint_sequential(model, 4, in); });
  const int64_t activation_bytes = 1024 * 64 * 4;
  RecordProperty("plain_peak_bytes", std::to_string(plain));
  RecordProperty("checkpoint_peak_bytes", std::to_string(checkpointed));
  EXPECT_LT(checkpointed, plain);
  // The plain run keeps two activations per block (Linear's and GELU's inputs); with 4
  // segments of 8 modules, at most the three boundaries, the last segment's 8 and one
  // recomputed segment's 8 coexist (plus a few gradient buffers) — half the plain run's.
  EXPECT_LT(checkpointed, plain - (2 * blocks / 4) * activation_bytes) << plain << " vs " << checkpointed;
}

}  // namespace
}  // namespace stowage::activation
