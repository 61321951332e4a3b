// checkpoint(): what it detects and refuses — a recomputation that differs from the
// forward, inputs modified in place, a failing recomputation, bad arguments (upstream
// TestCheckpoint's checks, test/test_utils.py).

#include <stowage/activation/checkpoint.h>

#include "cpu_rng.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace stowage::activation {
namespace {

using ::testing::HasSubstr;
using IValues = std::vector<c10::IValue>;
using testing::cpu_rng_state;

// test_checkpoint_detects_non_determinism, for the reentrant variant's outputs.
TEST(Checkpoint, DeterminismCheckDetectsADifferentRecomputation) {
  const at::Tensor x = torch::randn({4}).requires_grad_();
  int calls = 0;
  const auto changes_dtype = [&](const at::Tensor& in) { return ++calls == 1 ? in * 2 : (in * 2).to(torch::kDouble); };
  try {
    checkpoint(changes_dtype, x).sum().backward();
    FAIL() << "a recomputation with another dtype must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("output 0 shape [4], dtype Double"));
    EXPECT_THAT(e.what(), HasSubstr("dtype Float"));
  }
  // With the check off, the gradient still flows (cast back to the output's dtype).
  calls = 0;
  checkpoint(changes_dtype, x, CheckpointOptions().determinism_check(DeterminismCheck::Off)).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({4}, 2.0)));

  int calls2 = 0;
  const auto changes_count = [&](const IValues& in) -> IValues {
    if (++calls2 == 1) {
      return {in[0].toTensor() * 2};
    }
    return {in[0].toTensor() * 2, in[0].toTensor()};
  };
  const IValues out = checkpoint(changes_count, {x}, CheckpointOptions().determinism_check(DeterminismCheck::Off));
  try {
    out[0].toTensor().sum().backward();
    FAIL() << "a recomputation with another number of outputs must fail even without the determinism check";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("returned 2 outputs"));
  }
}

// Nothing the caller had is lost when the recomputation fails: the error surfaces from
// backward, the RNG stream is as before, and autograd keeps working.
TEST(Checkpoint, AFailingRecomputationLeavesRngAndAutogradIntact) {
  const at::Tensor x = torch::randn({8}).requires_grad_();
  int calls = 0;
  const at::Tensor y = checkpoint(
      [&](const at::Tensor& in) {
        if (++calls == 2) {
          throw std::runtime_error("fn failed on purpose");
        }
        return torch::dropout(in, 0.5, /*train=*/true);
      },
      x);
  const at::Tensor state = cpu_rng_state();
  try {
    y.sum().backward();
    FAIL() << "the recomputation's error must reach the caller";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("fn failed on purpose"));
  }
  EXPECT_TRUE(torch::equal(cpu_rng_state(), state));
  checkpoint([](const at::Tensor& in) { return in * 4; }, x).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({8}, 4.0)));
}

// The saved inputs are version-checked like any saved tensor: modifying one in place
// after the forward is a RecomputationError naming the input, never a silently wrong
// gradient.
TEST(Checkpoint, InputModifiedInPlaceAfterForwardIsDetected) {
  const at::Tensor leaf = torch::randn({4}).requires_grad_();
  at::Tensor x = leaf * 1;
  const at::Tensor y = checkpoint([](const at::Tensor& in) { return in.pow(2); }, x);
  x.add_(1);
  try {
    y.sum().backward();
    FAIL() << "the in-place modification must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("input 0 (shape [4]) was modified in place after the forward"));
  }
  EXPECT_FALSE(leaf.grad().defined());
}

// Issue 13: fn increments an input that does not require grad, then computes from it.
// The recomputation would increment the caller's tensor a second time and compute the
// weight's gradient at the wrong input; checkpoint refuses instead, naming the input,
// and the caller's tensor holds what a plain run of fn leaves in it.
TEST(Checkpoint, FnModifyingAnInputInPlaceIsARecomputationErrorNamingTheInput) {
  torch::manual_seed(0);
  torch::nn::Linear linear(8, 8);
  const auto fn = [&](const IValues& in) -> IValues {
    at::Tensor v = in[1].toTensor();
    v.add_(1);
    return {torch::tanh(linear->forward(v * in[0].toDouble()))};
  };
  const at::Tensor original = torch::randn({4, 8});

  at::Tensor plain_input = original.clone();
  fn({0.5, plain_input})[0].toTensor().sum().backward();
  ASSERT_TRUE(linear->weight.grad().defined());
  linear->weight.mutable_grad().reset();
  linear->bias.mutable_grad().reset();

  at::Tensor input = original.clone();
  try {
    checkpoint(fn, {0.5, input});
    FAIL() << "fn's in-place modification of its input must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("fn modified input 1 (shape [4, 8]) in place"));
  }
  EXPECT_TRUE(torch::equal(input, plain_input));
  EXPECT_FALSE(linear->weight.grad().defined());

  // Under no_grad nothing is recomputed, so the same fn is a plain call.
  at::Tensor no_grad_input = original.clone();
  {
    torch::NoGradGuard no_grad;
    checkpoint(fn, {0.5, no_grad_input});
  }
  EXPECT_TRUE(torch::equal(no_grad_input, plain_input));
}

// Tensors inside container inputs are read again by the recomputation too: modifying
// one between forward and backward (here by the caller), or inside fn, is detected.
TEST(Checkpoint, ATensorInsideAContainerInputModifiedInPlaceIsDetected) {
  const at::Tensor x = torch::randn({3}).requires_grad_();
  const at::Tensor scale = torch::full({3}, 2.0);
  const auto fn = [](const IValues& in) -> IValues { return {in[0].toTensor() * in[1].toTensorList().get(0)}; };
  const IValues out = checkpoint(fn, {x, c10::List<at::Tensor>({scale})});
  scale.add_(1);
  try {
    out[0].toTensor().sum().backward();
    FAIL() << "the in-place modification must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(), HasSubstr("a tensor (shape [3]) inside input 1 was modified in place after the forward"));
  }
  EXPECT_FALSE(x.grad().defined());

  const auto mutating_fn = [](const IValues& in) -> IValues {
    in[1].toTensorList().get(0).mul_(2);
    return {in[0].toTensor() * 2};
  };
  EXPECT_THROW(checkpoint(mutating_fn, {x, c10::List<at::Tensor>({scale})}), RecomputationError);
}

// An fn that behaves differently with grad enabled (as in the recomputation) and
// modifies an input only then is caught after the recomputation.
TEST(Checkpoint, FnModifyingAnInputOnlyInTheRecomputationIsDetected) {
  const at::Tensor x = torch::randn({3}).requires_grad_();
  const at::Tensor scale = torch::full({3}, 2.0);
  const auto fn = [](const IValues& in) -> IValues {
    const at::Tensor s = in[1].toTensorList().get(0);
    if (at::GradMode::is_enabled()) {
      s.mul_(2);
    }
    return {in[0].toTensor() * s};
  };
  const IValues out = checkpoint(fn, {x, c10::List<at::Tensor>({scale})});
  try {
    out[0].toTensor().sum().backward();
    FAIL() << "the in-place modification must be detected";
  } catch (const RecomputationError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("fn modified a tensor (shape [3]) inside input 1 in place during the recomputation"));
  }
}

TEST(Checkpoint, BadArgumentsAreClearErrors) {
  const at::Tensor x = torch::randn({2}).requires_grad_();
  try {
    checkpoint([](const at::Tensor& in) { return in; }, x, CheckpointOptions().use_reentrant(false));
    FAIL();
  } catch (const NotImplemented& e) {
    EXPECT_THAT(e.what(), HasSubstr("use_reentrant(false)"));
  }
  EXPECT_THROW(checkpoint(CheckpointFunction(), {x}), InvalidArgument);
  EXPECT_THROW(checkpoint([](const at::Tensor& in) { return in; }, at::Tensor()), InvalidArgument);
  try {
    checkpoint([](const IValues& in) -> IValues { return {c10::List<at::Tensor>({in[0].toTensor() * 2})}; }, {x});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("output 0 of fn is a"));
  }
}

}  // namespace
}  // namespace stowage::activation
