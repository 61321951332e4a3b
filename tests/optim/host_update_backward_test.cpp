// The update on the host's gradients leaving the device during backward
// (SwapOptimizerConfig::offload_gradients_in_backward, optim/host_gradients.h), on the
// simulated device: after backward the gradients hold no device memory, and the
// parameters and states equal those of the at-step() path (the gradients left on the
// device until step()) bit for bit, over several backward passes before a step and
// across zero_grad(). A sim::CopyGate holds the downloads until something waits for
// them, so the released memory is shown to stay untouched until its copy ran.

#include <stowage/build_info.h>

#include <gtest/gtest.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/memory/accounting.h>
#include <stowage/memory/skipped_sync.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/sim/sim.h>

#include "optim/swap_test_util.h"
#include "test_device.h"

#include <torch/torch.h>

#include <vector>
#endif

namespace stowage::optim {
namespace {

#if !defined(STOWAGE_WITH_SIM)

TEST(HostUpdateBackward, NeedsTheSimulatedDevice) {
  GTEST_SKIP() << "on the CPU the update is in place and no gradient moves; the simulated device needs LibTorch 2.x, "
                  "this build is against "
               << build_info().libtorch_version;
}

#else

const testing::Shapes kBackwardShapes = {{testing::kSwappedNumel * 2}, {64, 40}, {testing::kSwappedNumel}};

class HostUpdateBackward : public ::testing::Test {
 protected:
  void TearDown() override {
    memory::skip_sync_for_testing(memory::SkippedSync::kNone);
    sim::synchronize_all();
    sim::clear_hazards();
  }
};

// Copies of the same parameters on the simulated device, with an update on the host that
// offloads the gradients during backward or leaves them until step().
struct BackwardRun {
  BackwardRun(bool offload_in_backward, double fraction = 1.0) {
    const auto host = testing::make_params(kBackwardShapes);
    for (const auto& p : host) params.push_back(p.detach().to(stowage::testing::test_device()).requires_grad_());
    optimizer = swap_optimizer(testing::adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.05)),
                               SwapOptimizerConfig()
                                   .swap_times(2)
                                   .update_on_host(true)
                                   .offload_fraction(fraction)
                                   .offload_gradients_in_backward(offload_in_backward));
  }

  // loss = sum_i <p_i, x_i>, x_i drawn for `pass`: p_i's gradient is exactly x_i.
  void backward(int pass) {
    torch::Tensor loss;
    for (size_t i = 0; i < params.size(); ++i) {
      torch::manual_seed(1000 * pass + static_cast<int64_t>(i));
      const torch::Tensor x = torch::randn(params[i].sizes()).to(params[i].device());
      const torch::Tensor term = (params[i] * x).sum();
      loss = loss.defined() ? loss + term : term;
    }
    loss.backward();
  }

  int64_t gradient_bytes() const {
    int64_t bytes = 0;
    for (const auto& p : params) bytes += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
    return bytes;
  }

  std::vector<torch::Tensor> params;
  c10::intrusive_ptr<SwapOptimizer> optimizer;
};

void expect_backward_runs_equal(const BackwardRun& offloaded, const BackwardRun& at_step) {
  for (size_t i = 0; i < offloaded.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(offloaded.params[i].detach().cpu(), at_step.params[i].detach().cpu()))
        << "parameter " << i;
  }
  testing::expect_state_dicts_equal(at_step.optimizer->state_dict(), offloaded.optimizer->state_dict());
}

TEST_F(HostUpdateBackward, BackwardLeavesNoGradientOnTheDevice) {
  const c10::Device device = stowage::testing::test_device();
  BackwardRun offloaded(/*offload_in_backward=*/true);
  BackwardRun at_step(/*offload_in_backward=*/false);
  int64_t param_bytes = 0;
  for (const auto& p : offloaded.params) param_bytes += static_cast<int64_t>(p.nbytes());

  const int64_t before_offloaded = memory::memory_allocated(device);
  offloaded.backward(0);
  EXPECT_EQ(memory::memory_allocated(device) - before_offloaded, 0);
  EXPECT_EQ(offloaded.gradient_bytes(), 0);

  const int64_t before_at_step = memory::memory_allocated(device);
  at_step.backward(0);
  EXPECT_GE(memory::memory_allocated(device) - before_at_step, param_bytes);
  EXPECT_EQ(at_step.gradient_bytes(), param_bytes);

  offloaded.optimizer->step();
  at_step.optimizer->step();
  expect_backward_runs_equal(offloaded, at_step);
  EXPECT_TRUE(sim::hazards().empty());
}

// Autograd sums the gradients of two backward passes on the device; the offload sums
// them on the host, to the same bits.
TEST_F(HostUpdateBackward, TwoBackwardPassesBeforeAStepAddUp) {
  BackwardRun offloaded(/*offload_in_backward=*/true);
  BackwardRun at_step(/*offload_in_backward=*/false);
  for (BackwardRun* run : {&offloaded, &at_step}) {
    for (int step = 0; step < 3; ++step) {
      for (int pass = 0; pass <= step; ++pass) run->backward(10 * step + pass);
      run->optimizer->step();
      run->optimizer->zero_grad();
    }
  }
  EXPECT_EQ(offloaded.gradient_bytes(), 0);
  expect_backward_runs_equal(offloaded, at_step);
}

// zero_grad() discards what the host holds, as it drops the device's gradients.
TEST_F(HostUpdateBackward, ZeroGradDiscardsTheGradientsHeldOnTheHost) {
  BackwardRun offloaded(/*offload_in_backward=*/true);
  BackwardRun at_step(/*offload_in_backward=*/false);
  for (BackwardRun* run : {&offloaded, &at_step}) {
    run->backward(0);
    run->optimizer->zero_grad();
    run->backward(1);
    run->optimizer->step();
  }
  expect_backward_runs_equal(offloaded, at_step);
}

// Half the bytes updated on the host, their gradients offloaded; the others stay on the
// device for the swap's update.
TEST_F(HostUpdateBackward, HalfOffloadedKeepsTheDevicesShareOnTheDevice) {
  BackwardRun offloaded(/*offload_in_backward=*/true, /*fraction=*/0.5);
  BackwardRun at_step(/*offload_in_backward=*/false, /*fraction=*/0.5);
  offloaded.backward(0);
  at_step.backward(0);
  // The first half of the bytes, rounded up to a whole parameter: 16 + 10 KiB of 34.
  EXPECT_FALSE(offloaded.params[0].grad().defined());
  EXPECT_FALSE(offloaded.params[1].grad().defined());
  EXPECT_TRUE(offloaded.params[2].grad().defined());
  offloaded.optimizer->step();
  at_step.optimizer->step();
  expect_backward_runs_equal(offloaded, at_step);
}

// The downloads are held while backward frees the gradients (and, with `reuse`, the
// device allocates and writes as much memory): the lane's record of each gradient keeps
// its memory from reuse, and from the simulator's poison, until its copy ran.
bool offload_survives_release_before_download(bool reuse) {
  BackwardRun offloaded(/*offload_in_backward=*/true);
  BackwardRun at_step(/*offload_in_backward=*/false);
  {
    const sim::CopyGate held;
    offloaded.backward(0);
    std::vector<torch::Tensor> written;
    for (const auto& p : offloaded.params) {
      if (reuse) written.push_back(torch::zeros_like(p).add_(3));
    }
    offloaded.optimizer->step();
  }
  at_step.backward(0);
  at_step.optimizer->step();
  bool equal = true;
  for (size_t i = 0; i < offloaded.params.size(); ++i) {
    equal = equal && torch::equal(offloaded.params[i].detach().cpu(), at_step.params[i].detach().cpu());
  }
  return equal;
}

TEST_F(HostUpdateBackward, ReleasedGradientMemoryIsReusedOnlyAfterItsDownload) {
  EXPECT_TRUE(offload_survives_release_before_download(/*reuse=*/true));
  EXPECT_TRUE(sim::hazards().empty());
}

TEST_F(HostUpdateBackward, WithoutRecordStreamTheDownloadReadsPoisonedMemory) {
  memory::skip_sync_for_testing(memory::SkippedSync::kRecordStream);
  EXPECT_FALSE(offload_survives_release_before_download(/*reuse=*/false));
}

#endif

}  // namespace
}  // namespace stowage::optim
