// CheckpointOptions::offload_inputs. On the test device (the simulated accelerator in
// builds against LibTorch 2.x, whose poisoned frees and hazard checks catch a missing
// wait): gradients bit-identical to keeping the inputs, and the segments' inputs off the
// device between forward and backward. On the CPU: nothing changes, and it says so.

#include <stowage/activation/sequential.h>
#include <stowage/memory/accounting.h>

#include "activation/gradients.h"
#include "test_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace stowage::activation {
namespace {

using testing::expect_bit_identical;
using ::testing::HasSubstr;

constexpr int64_t kBlocks = 8;
constexpr int64_t kWidth = 256;
constexpr int64_t kRows = 512;  // a boundary holds kRows * kWidth floats: 512 KiB

// kBlocks blocks, each a Linear and a GELU (two modules), on `device`.
torch::nn::Sequential linear_gelu_blocks(c10::Device device) {
  torch::manual_seed(11);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < kBlocks; ++i) {
    model->push_back(torch::nn::Linear(kWidth, kWidth));
    model->push_back(torch::nn::GELU());
  }
  model->to(device);
  return model;
}

// One backward through checkpoint_sequential with `segments`: the input's gradient, then
// every parameter's.
std::vector<at::Tensor> sequential_gradients(torch::nn::Sequential& model, const at::Tensor& x,
                                             const CheckpointOptions& options, int64_t segments = kBlocks) {
  return testing::gradients_after(*model, x, [&](const at::Tensor& in) {
    return checkpoint_sequential(model, segments, in, options).pow(2).mean();
  });
}

TEST(OffloadInputs, GradientsAreBitIdenticalToKeepingTheInputs) {
  const c10::Device device = testing::test_device();
  torch::nn::Sequential model = linear_gelu_blocks(device);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::TensorOptions().device(device));
  const std::vector<at::Tensor> kept = sequential_gradients(model, x, CheckpointOptions());
  for (const int64_t segments : std::vector<int64_t>{2, 4, kBlocks}) {
    SCOPED_TRACE(segments);
    expect_bit_identical(sequential_gradients(model, x, CheckpointOptions().offload_inputs(true), segments),
                         sequential_gradients(model, x, CheckpointOptions(), segments));
  }
  expect_bit_identical(sequential_gradients(model, x, CheckpointOptions().offload_inputs(true)), kept);
}

TEST(OffloadInputs, ASecondBackwardBringsTheInputsBackAgain) {
  const c10::Device device = testing::test_device();
  torch::nn::Linear layer(kWidth, kWidth);
  layer->to(device);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::TensorOptions().device(device)).requires_grad_();
  const auto run = [&](const at::Tensor& in) { return torch::gelu(layer->forward(in)); };
  const at::Tensor loss = checkpoint(run, x, CheckpointOptions().offload_inputs(true)).sum();
  loss.backward({}, /*retain_graph=*/true);
  const at::Tensor first = x.grad().clone();
  loss.backward();
  EXPECT_TRUE(torch::equal(x.grad().cpu(), (2 * first).cpu()));
}

// Between the forward and the backward, the inputs of the checkpointed segments are in
// host memory; the step's peak falls with them.
TEST(OffloadInputs, TheSegmentsInputsLeaveTheDeviceUntilBackward) {
  const c10::Device device = testing::test_device();
  if (device.is_cpu()) GTEST_SKIP() << "offload runs on a device: this build tests on the CPU";
  torch::nn::Sequential model = linear_gelu_blocks(device);
  const at::Tensor x = torch::randn({kRows, kWidth}, torch::TensorOptions().device(device));
  struct Held {
    int64_t after_forward;
    int64_t peak;
  };
  const auto held = [&](const CheckpointOptions& options) {
    sequential_gradients(model, x, options);  // warm-up: the same gradients come and go in the measured step
    model->zero_grad();
    const at::Tensor input = x.detach().requires_grad_();
    memory::reset_peak_memory_stats(device);
    const int64_t before = memory::memory_allocated(device);
    const at::Tensor loss = checkpoint_sequential(model, kBlocks, input, options).pow(2).mean();
    const int64_t after_forward = memory::memory_allocated(device) - before;
    loss.backward();
    return Held{after_forward, memory::max_memory_allocated(device) - before};
  };
  const Held kept = held(CheckpointOptions());
  const Held offloaded = held(CheckpointOptions().offload_inputs(true));
  const int64_t boundary = kRows * kWidth * static_cast<int64_t>(sizeof(float));
  // The inputs of segments 1 .. kBlocks - 2 (segment 0's is the caller's, which it holds).
  EXPECT_GE(kept.after_forward - offloaded.after_forward, (kBlocks - 2) * boundary)
      << "kept " << kept.after_forward << ", offloaded " << offloaded.after_forward;
  // In backward, a segment's own input and the one prefetched come back.
  EXPECT_LE(offloaded.peak, kept.peak - 2 * boundary) << "kept " << kept.peak << ", offloaded " << offloaded.peak;
}

// The warning comes once per process: the check runs in a fresh one (a death test in the
// threadsafe style re-runs the binary), whatever ran before it here. Its exit status is the
// number of warnings.
TEST(OffloadInputs, OnTheCpuItDoesNothingAndSaysSoOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  torch::nn::Sequential model = linear_gelu_blocks(c10::kCPU);
  const at::Tensor x = torch::randn({8, kWidth});
  EXPECT_EXIT(
      {
        ::testing::internal::CaptureStderr();
        sequential_gradients(model, x, CheckpointOptions().offload_inputs(true));  // kBlocks - 1 checkpoints
        const std::string warnings = ::testing::internal::GetCapturedStderr();
        std::fputs(warnings.c_str(), stderr);
        int count = 0;
        for (size_t at = warnings.find("offload_inputs"); at != std::string::npos;
             at = warnings.find("offload_inputs", at + 1)) {
          ++count;
        }
        std::_Exit(count);
      },
      ::testing::ExitedWithCode(1), "offload_inputs does nothing for inputs on the CPU");
  expect_bit_identical(sequential_gradients(model, x, CheckpointOptions().offload_inputs(true)),
                       sequential_gradients(model, x, CheckpointOptions()));
}

}  // namespace
}  // namespace stowage::activation
