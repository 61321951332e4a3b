// checkpoint(): seed 001's validation and the upstream TestCheckpoint / TestAutograd
// cases that carry over to C++ (test/test_utils.py, test/test_autograd.py).

#include <stowage/activation/checkpoint.h>

#include "cpu_rng.h"
#include "test_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace stowage::activation {
namespace {

using ::testing::HasSubstr;
using IValues = std::vector<c10::IValue>;
using testing::cpu_rng_state;
using testing::set_cpu_rng_state;

torch::nn::Sequential linear_stack(int64_t width, int64_t depth) {
  torch::nn::Sequential stack;
  for (int64_t i = 0; i < depth; ++i) {
    stack->push_back(torch::nn::Linear(width, width));
    stack->push_back(torch::nn::Tanh());
  }
  return stack;
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> grads;
  grads.reserve(tensors.size());
  for (const auto& t : tensors) {
    grads.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
  }
  return grads;
}

void reset_grads(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    t.mutable_grad().reset();
  }
}

void expect_bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined()) << "gradient " << i;
    ASSERT_TRUE(b[i].defined()) << "gradient " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "gradient " << i;
  }
}

TEST(Checkpoint, LinearStackOnTheBuildsDeviceEqualsPlainRunBitForBit) {
  // Seed 001: forward + backward through checkpoint on device tensors equals the plain run.
  torch::manual_seed(0);
  auto model = linear_stack(16, 3);
  model->to(testing::test_device());
  const at::Tensor x = torch::randn({8, 16}, torch::TensorOptions().device(testing::test_device())).requires_grad_();
  std::vector<at::Tensor> leaves = model->parameters();
  leaves.push_back(x);

  const at::Tensor plain = model->forward(x);
  plain.pow(2).sum().backward();
  const auto plain_grads = grads_of(leaves);
  reset_grads(leaves);

  const at::Tensor checkpointed = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  EXPECT_TRUE(checkpointed.requires_grad());
  checkpointed.pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(plain, checkpointed));
  expect_bitwise_equal(plain_grads, grads_of(leaves));
}

TEST(Checkpoint, RunsFnOnceInForwardAndOnceMoreInBackward) {
  int calls = 0;
  const at::Tensor x = torch::randn({4}).requires_grad_();
  const at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        ++calls;
        return in.sin().exp();
      },
      x);
  EXPECT_EQ(calls, 1);
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::equal(x.grad(), (x.sin().exp() * x.cos()).detach()));
}

// test_checkpoint_rng_cpu: dropout inside the checkpoint draws the same mask in the
// recomputation, so gradients equal a plain run from the same RNG state.
TEST(Checkpoint, DropoutRecomputationReplaysTheRngState) {
  torch::nn::Dropout dropout(0.5);
  const auto fn = [&](const at::Tensor& in) { return dropout->forward(in * 2); };
  for (int iteration = 0; iteration < 5; ++iteration) {
    const at::Tensor input = torch::randn({20000}).requires_grad_();
    const at::Tensor state = cpu_rng_state();
    const at::Tensor out = checkpoint(fn, input);
    const at::Tensor state_before_backward = cpu_rng_state();
    out.backward(torch::ones_like(out));
    // The replay leaves the surrounding RNG stream as it was.
    EXPECT_TRUE(torch::equal(cpu_rng_state(), state_before_backward));
    const at::Tensor checkpoint_grad = input.grad().clone();

    set_cpu_rng_state(state);
    const at::Tensor plain_input = input.detach().clone().requires_grad_();
    const at::Tensor plain_out = fn(plain_input);
    plain_out.backward(torch::ones_like(plain_out));
    EXPECT_TRUE(torch::equal(out, plain_out));
    EXPECT_TRUE(torch::equal(checkpoint_grad, plain_input.grad()));
  }
}

// test_checkpoint_not_preserve_rng_state: runs; the recomputation then draws a new
// mask, so the gradient no longer matches the forward's mask (which is why the
// default preserves the state).
TEST(Checkpoint, WithoutPreservedRngStateTheRecomputationDrawsANewMask) {
  torch::manual_seed(3);
  torch::nn::Dropout dropout(0.5);
  const at::Tensor input = torch::ones({20000}).requires_grad_();
  const at::Tensor out = checkpoint([&](const at::Tensor& in) { return dropout->forward(in); }, input,
                                    CheckpointOptions().preserve_rng_state(false));
  out.sum().backward();
  // Plain dropout's gradient is exactly its output's pattern (scale where kept, 0 where dropped).
  EXPECT_FALSE(torch::equal(input.grad(), out.detach()));
}

// Seed 001 on the build's device (a GPU, the simulated device, or the CPU): dropout inside
// the checkpoint draws from the device's generator, and the recomputation replays it, so
// outputs and gradients equal a plain run's from the same generator state bit for bit.
TEST(Checkpoint, DropoutOnTheBuildsDeviceReplaysFromTheDevicesGenerator) {
  const c10::Device device = testing::test_device();
  torch::nn::Dropout dropout(0.5);
  const auto fn = [&](const at::Tensor& in) { return dropout->forward(torch::tanh(in) * 2); };
  for (int iteration = 0; iteration < 3; ++iteration) {
    const at::Tensor input = torch::randn({1 << 14}, torch::TensorOptions().device(device)).requires_grad_();
    at::Generator generator = at::globalContext().defaultGenerator(device);  // a handle: set_state is non-const
    const at::Tensor device_state = generator.get_state();
    const at::Tensor out = checkpoint(fn, input);
    out.backward(torch::ones_like(out));

    generator.set_state(device_state);
    const at::Tensor plain_input = input.detach().clone().requires_grad_();
    const at::Tensor plain_out = fn(plain_input);
    plain_out.backward(torch::ones_like(plain_out));
    EXPECT_TRUE(torch::equal(out, plain_out));
    EXPECT_TRUE(torch::equal(input.grad(), plain_input.grad()));
    EXPECT_GT(out.eq(0).sum().item<int64_t>(), 1000);  // dropout did drop
  }
}

// test_checkpoint_non_tensor_inputs_outputs.
TEST(Checkpoint, NonTensorInputsAndOutputsPassThrough) {
  const auto foo = [](const IValues& in) -> IValues {
    const at::Tensor t1 = in[0].toTensor();
    const at::Tensor t2 = in[1].toTensor();
    const int64_t scale = in[2].toInt();
    const at::Tensor t3 = in[3].toTensor();
    at::Tensor t4 = t1 + t2 * t3;
    at::Tensor t5 = t1 * t2 + t3;
    t4 *= scale;
    t5 *= scale;
    return {scale, t4, c10::IValue(), true, t5, std::string("bar"), t1};
  };
  const at::Tensor t1 = torch::rand({10}).requires_grad_();
  const at::Tensor t2 = torch::rand({10}).requires_grad_();
  const at::Tensor t3 = torch::rand({10});
  const int64_t scale = 7;

  const IValues res = checkpoint(foo, {t1, t2, scale, t3});
  ASSERT_EQ(res.size(), 7u);
  EXPECT_EQ(res[0].toInt(), scale);
  EXPECT_TRUE(torch::equal(res[1].toTensor(), (t1 + t2 * t3) * scale));
  EXPECT_TRUE(res[2].isNone());
  EXPECT_TRUE(res[3].toBool());
  EXPECT_TRUE(torch::equal(res[4].toTensor(), (t1 * t2 + t3) * scale));
  EXPECT_EQ(res[5].toStringRef(), "bar");
  EXPECT_TRUE(torch::equal(res[6].toTensor(), t1));

  res[1].toTensor().sum().backward({}, /*retain_graph=*/true);
  res[4].toTensor().sum().backward({}, /*retain_graph=*/true);
  res[6].toTensor().sum().backward();
  try {
    res[6].toTensor().sum().backward();
    FAIL() << "a second backward without retain_graph must fail";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Trying to backward through the graph a second time"));
  }
  const at::Tensor t1_grad = t1.grad().clone();
  const at::Tensor t2_grad = t2.grad().clone();

  reset_grads({t1, t2});
  const IValues plain = foo({t1, t2, scale, t3});
  torch::autograd::backward({plain[1].toTensor().sum(), plain[4].toTensor().sum(), plain[6].toTensor().sum()});
  EXPECT_TRUE(torch::allclose(t1.grad(), t1_grad));
  EXPECT_TRUE(torch::allclose(t2.grad(), t2_grad));
}

// test_checkpoint_no_tensors: only scalars in and out.
TEST(Checkpoint, InputsWithoutTensorsWork) {
  const auto foo = [](const IValues& in) -> IValues {
    const double t4 = (in[0].toDouble() + in[1].toDouble() * in[3].toDouble()) * in[2].toInt();
    return {in[2], t4, c10::IValue(), true, std::string("bar")};
  };
  const IValues res = checkpoint(foo, {0.25, 0.5, int64_t{3}, 2.0});
  ASSERT_EQ(res.size(), 5u);
  EXPECT_EQ(res[0].toInt(), 3);
  EXPECT_DOUBLE_EQ(res[1].toDouble(), 3.75);
  EXPECT_TRUE(res[2].isNone());
  EXPECT_EQ(res[4].toStringRef(), "bar");
}

// test_checkpoint_non_tensor: a None argument.
TEST(Checkpoint, NoneInputIsPassedToFn) {
  const at::Tensor x = torch::randn({1, 100}).requires_grad_();
  const IValues out = checkpoint(
      [](const IValues& in) -> IValues {
        EXPECT_TRUE(in[1].isNone());
        return {in[0].toTensor().relu()};
      },
      {x, c10::IValue()});
  out[0].toTensor().sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), (x > 0).to(torch::kFloat)));
}

// test_checkpoint_partial_grad.
TEST(Checkpoint, PartialGradAndOutputsThatDoNotRequireGrad) {
  const auto pass_both = [](const IValues& in) -> IValues { return {in[0], in[1]}; };
  const at::Tensor a = torch::randn({1, 4}).requires_grad_();
  const at::Tensor b = torch::randn({1, 4});
  const IValues out = checkpoint(pass_both, {a, b});
  out[0].toTensor().sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), torch::ones({1, 4})));

  // The output is the input that doesn't require grad. Upstream raises "none of output
  // has requires_grad=True"; here backward warns and passes no gradient (the true
  // gradient), because with the #7617 fix frozen segments legitimately get here.
  const auto pass_first = [](const IValues& in) -> IValues { return {in[0]}; };
  const at::Tensor c = torch::randn({1, 4});
  const at::Tensor d = torch::randn({1, 4}).requires_grad_();
  const IValues out2 = checkpoint(pass_first, {c, d});
  // LibTorch's default warning handler writes to stderr (its handler API differs between 1.13 and 2.x).
  ::testing::internal::CaptureStderr();
  out2[0].toTensor().sum().backward();
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("no output of fn that received a gradient requires grad"));
  EXPECT_FALSE(d.grad().defined());
}

// PyTorch #7617: no input requires grad, but fn's parameters do.
TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  torch::manual_seed(1);
  auto model = linear_stack(8, 2);
  const at::Tensor x = torch::randn({5, 8});
  model->forward(x).sum().backward();
  const auto plain_grads = grads_of(model->parameters());
  reset_grads(model->parameters());

  const at::Tensor out = checkpoint([&](const at::Tensor& in) { return model->forward(in); }, x);
  EXPECT_TRUE(out.requires_grad());
  out.sum().backward();
  expect_bitwise_equal(plain_grads, grads_of(model->parameters()));
}

TEST(Checkpoint, SeveralOutputsIncludingAnIntegerOne) {
  const at::Tensor x = torch::randn({3, 5}).requires_grad_();
  const auto fn = [](const IValues& in) -> IValues {
    const at::Tensor t = in[0].toTensor();
    return {t.exp(), t.argmax(1), t.sin()};
  };
  const IValues out = checkpoint(fn, {x});
  EXPECT_FALSE(out[1].toTensor().requires_grad());
  EXPECT_TRUE(torch::equal(out[1].toTensor(), x.argmax(1)));
  (out[0].toTensor().sum() + out[2].toTensor().sum()).backward();
  const at::Tensor grad = x.grad().clone();
  x.mutable_grad().reset();
  const IValues plain = fn({x});
  (plain[0].toTensor().sum() + plain[2].toTensor().sum()).backward();
  EXPECT_TRUE(torch::equal(grad, x.grad()));
}

TEST(Checkpoint, TheSameTensorReturnedTwiceGetsBothGradients) {
  const at::Tensor x = torch::randn({3}).requires_grad_();
  const IValues out = checkpoint(
      [](const IValues& in) -> IValues {
        const at::Tensor y = in[0].toTensor() * 2;
        return {y, y};
      },
      {x});
  (out[0].toTensor() * 3 + out[1].toTensor() * 5).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 16.0)));
}

TEST(Checkpoint, AViewOfTheInputAsOutput) {
  const at::Tensor x = torch::randn({4, 3}).requires_grad_();
  const at::Tensor y = checkpoint([](const at::Tensor& in) { return in.narrow(0, 1, 2); }, x);
  (y * 2).sum().backward();
  const at::Tensor expected = torch::zeros({4, 3}).index_fill_(0, torch::tensor({1, 2}), 2.0);
  EXPECT_TRUE(torch::equal(x.grad(), expected));
}

// test_checkpointing: 2000 checkpoints in one graph.
TEST(Checkpoint, TwoThousandCheckpointsInOneGraph) {
  torch::manual_seed(2);
  torch::nn::Sequential module(torch::nn::Linear(10, 1000), torch::nn::ReLU(), torch::nn::Linear(1000, 10));
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> features;
  for (int r = 0; r < 2000; ++r) {
    inputs.push_back(torch::empty({1, 10}).uniform_().requires_grad_());
    features.push_back(checkpoint([&](const at::Tensor& in) { return module->forward(in); }, inputs.back()));
  }
  torch::stack(features).mean().backward();
  const auto checkpoint_grads = grads_of(inputs);
  const auto checkpoint_param_grads = grads_of(module->parameters());

  reset_grads(inputs);
  reset_grads(module->parameters());
  std::vector<at::Tensor> plain;
  plain.reserve(inputs.size());
  for (const auto& in : inputs) {
    plain.push_back(module->forward(in));
  }
  torch::stack(plain).mean().backward();
  expect_bitwise_equal(grads_of(inputs), checkpoint_grads);
  const auto plain_param_grads = grads_of(module->parameters());
  for (size_t i = 0; i < plain_param_grads.size(); ++i) {
    // 2000 contributions summed in a different order: equal up to rounding.
    EXPECT_TRUE(torch::allclose(plain_param_grads[i], checkpoint_param_grads[i], 1e-4, 1e-7)) << i;
  }
}

// test_checkpoint_valid / test_checkpoint_valid_reset_on_error.
TEST(Checkpoint, GradBackwardWithInputsAndCreateGraphAreRejectedAndAutogradKeepsWorking) {
  const at::Tensor x = torch::randn({4}).requires_grad_();
  const auto fn = [](const at::Tensor& in) { return in.exp(); };

  const at::Tensor loss = checkpoint(fn, x).sum();
  try {
    torch::autograd::grad({loss}, {x});
    FAIL() << "autograd::grad through a reentrant checkpoint must fail";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot run under torch::autograd::grad()"));
  }
  const at::Tensor loss2 = checkpoint(fn, x).sum();
  EXPECT_THROW(torch::autograd::backward({loss2}, {}, c10::nullopt, false, {x}), RecomputationError);

  const at::Tensor loss3 = checkpoint(fn, x).sum();
  try {
    loss3.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "gradients of gradients through a reentrant checkpoint must fail";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("create_graph=true"));
  }
  EXPECT_FALSE(x.grad().defined());

  checkpoint(fn, x).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), x.exp().detach()));
  // Autograd outside checkpoints is unaffected, too.
  EXPECT_TRUE(torch::equal(torch::autograd::grad({x.exp().sum()}, {x})[0], x.exp().detach()));
}

TEST(Checkpoint, NoLeakedGraphOrState) {
  auto sentinel = std::make_shared<int>(0);
  const at::Tensor x = torch::randn({4}).requires_grad_();
  std::weak_ptr<torch::autograd::Node> node;
  {
    const at::Tensor y = checkpoint([sentinel](const at::Tensor& in) { return in * 3; }, x);
    node = y.grad_fn();
    EXPECT_FALSE(node.expired());
    EXPECT_GT(sentinel.use_count(), 1);
    y.sum().backward();
  }
  EXPECT_TRUE(node.expired());
  EXPECT_EQ(sentinel.use_count(), 1);
  {
    // Forward only: dropping the output frees everything too.
    const at::Tensor y = checkpoint([sentinel](const at::Tensor& in) { return in * 3; }, x);
    node = y.grad_fn();
  }
  EXPECT_TRUE(node.expired());
  EXPECT_EQ(sentinel.use_count(), 1);
}

TEST(Checkpoint, RetainGraphRecomputesForASecondBackward) {
  int calls = 0;
  const at::Tensor x = torch::randn({6}).requires_grad_();
  const at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        ++calls;
        return in.tanh();
      },
      x);
  y.sum().backward({}, /*retain_graph=*/true);
  const at::Tensor once = x.grad().clone();
  y.sum().backward();
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(torch::equal(x.grad(), once * 2));
}

TEST(Checkpoint, NestedCheckpointsEqualThePlainRun) {
  const at::Tensor x = torch::randn({5}).requires_grad_();
  const auto inner = [](const at::Tensor& in) { return in.sin() * in; };
  const auto outer = [&](const at::Tensor& in) { return checkpoint(inner, in.exp()).cos(); };
  checkpoint(outer, x).sum().backward();
  const at::Tensor nested_grad = x.grad().clone();
  x.mutable_grad().reset();
  inner(x.exp()).cos().sum().backward();
  EXPECT_TRUE(torch::equal(nested_grad, x.grad()));
}

TEST(Checkpoint, UnderNoGradRunsOnceAndRecordsNothing) {
  int calls = 0;
  const at::Tensor x = torch::randn({3}).requires_grad_();
  torch::NoGradGuard no_grad;
  const at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        ++calls;
        return in * 2;
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
}

}  // namespace
}  // namespace stowage::activation
