// Ops on the simulated accelerator compute what the CPU computes, bit for bit, including
// what a kernel writes into an argument its schema does not mark as written (batch norm's
// running statistics), what an op writes into its out= and in-place arguments, and the
// views that ops without a kernel of the simulator's own return; and such a write is
// checked for hazards as a write.
#include <stowage/build_info.h>

#include <gtest/gtest.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gmock/gmock.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>
#endif

namespace sim_ops_test {  // a name of its own: the unity build joins the folder's files
namespace {

#if !defined(STOWAGE_WITH_SIM)

TEST(SimOps, NeedsLibTorch2) {
  GTEST_SKIP() << "the simulated device needs LibTorch 2.x; this build is against "
               << stowage::build_info().libtorch_version;
}

#else

namespace sim = stowage::sim;
using ::testing::ContainsRegex;

// Registered while the program loads, before any backward (see register_device).
const bool kSimRegisteredAtLoad = (sim::register_device(), true);

c10::Device sim0() {
  return sim::device(0);
}

void expect_bit_identical(const at::Tensor& on_sim, const at::Tensor& on_cpu, const std::string& what) {
  ASSERT_TRUE(on_sim.defined()) << what;
  EXPECT_EQ(on_sim.device(), sim0()) << what;
  EXPECT_TRUE(torch::equal(on_sim.cpu(), on_cpu)) << what << " on sim:\n"
                                                  << on_sim.cpu() << "\non the CPU:\n"
                                                  << on_cpu;
}

// ---------------------------------------------------------------- batch norm

// The output, every gradient and every buffer of one forward and backward of `on_sim` (a
// clone of `on_cpu` on sim:0) equal the CPU's.
void expect_step_bit_identical(torch::nn::AnyModule& on_cpu, torch::nn::AnyModule& on_sim, const at::Tensor& x) {
  const at::Tensor loss_weights = torch::randn(x.sizes());  // a sum alone has no gradient through batch norm
  const at::Tensor cpu_input = x.clone().requires_grad_();
  const at::Tensor sim_input = x.to(sim0()).requires_grad_();
  const at::Tensor cpu_output = on_cpu.forward(cpu_input);
  const at::Tensor sim_output = on_sim.forward(sim_input);
  (cpu_output * loss_weights).sum().backward();
  (sim_output * loss_weights.to(sim0())).sum().backward();
  expect_bit_identical(sim_output, cpu_output, "the output");
  expect_bit_identical(sim_input.grad(), cpu_input.grad(), "the input's gradient");
  const auto sim_parameters = on_sim.ptr()->named_parameters();
  for (const auto& item : on_cpu.ptr()->named_parameters()) {
    expect_bit_identical(sim_parameters[item.key()].grad(), item.value().grad(), item.key() + "'s gradient");
  }
  const auto sim_buffers = on_sim.ptr()->named_buffers();
  for (const auto& item : on_cpu.ptr()->named_buffers()) {
    expect_bit_identical(sim_buffers[item.key()], item.value(), item.key());
  }
}

struct NormCase {
  std::string name;
  std::function<torch::nn::AnyModule()> make;
  std::vector<int64_t> input_shape;
};

std::ostream& operator<<(std::ostream& out, const NormCase& c) {
  return out << c.name;
}

class BatchNormOnSim : public ::testing::TestWithParam<NormCase> {};

TEST_P(BatchNormOnSim, TrainingStepsMatchTheCpuAndMoveTheRunningStatistics) {
  torch::manual_seed(11);
  torch::nn::AnyModule on_cpu = GetParam().make();
  torch::nn::AnyModule on_sim = on_cpu.clone(sim0());
  for (int step = 1; step <= 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    expect_step_bit_identical(on_cpu, on_sim, torch::randn(GetParam().input_shape) * 2 + 0.5);
  }
  // What the comparison stands on: the statistics moved from their initial zeros and ones.
  const auto buffers = on_sim.ptr()->named_buffers();
  const at::Tensor running_mean = buffers["running_mean"].cpu();
  const at::Tensor running_var = buffers["running_var"].cpu();
  EXPECT_GT(running_mean.abs().min().item<float>(), 0) << running_mean;
  EXPECT_FALSE(torch::equal(running_var, torch::ones_like(running_var))) << running_var;
}

TEST_P(BatchNormOnSim, AnEvaluationStepMatchesTheCpuAndLeavesTheStatistics) {
  torch::manual_seed(12);
  torch::nn::AnyModule on_cpu = GetParam().make();
  torch::nn::AnyModule on_sim = on_cpu.clone(sim0());
  expect_step_bit_identical(on_cpu, on_sim, torch::randn(GetParam().input_shape) + 1);  // statistics to evaluate with
  on_cpu.ptr()->eval();
  on_sim.ptr()->eval();
  std::vector<at::Tensor> before;
  for (const at::Tensor& buffer : on_cpu.ptr()->buffers()) before.push_back(buffer.clone());
  expect_step_bit_identical(on_cpu, on_sim, torch::randn(GetParam().input_shape) - 1);
  const std::vector<at::Tensor> after = on_cpu.ptr()->buffers();  // the CPU's: the sim's equal them
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << "buffer " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Norms, BatchNormOnSim,
    ::testing::Values(
        NormCase{"BatchNorm1d", [] { return torch::nn::AnyModule(torch::nn::BatchNorm1d(5)); }, {8, 5}},
        NormCase{"BatchNorm1dOverSequences", [] { return torch::nn::AnyModule(torch::nn::BatchNorm1d(5)); }, {4, 5, 7}},
        NormCase{"BatchNorm2d", [] { return torch::nn::AnyModule(torch::nn::BatchNorm2d(3)); }, {4, 3, 5, 6}},
        // Through batch norm, on running statistics repeated per sample and
        // averaged back.
        NormCase{"InstanceNorm1dTrackingRunningStats",
                 [] {
                   return torch::nn::AnyModule(torch::nn::InstanceNorm1d(
                       torch::nn::InstanceNorm1dOptions(4).affine(true).track_running_stats(true)));
                 },
                 {3, 4, 9}}),
    [](const ::testing::TestParamInfo<NormCase>& info) { return info.param.name; });

// batch_norm_update_stats writes the running statistics it is given, unmarked in its schema too.
TEST(SimOps, BatchNormUpdateStatsWritesTheRunningStatisticsAsOnTheCpu) {
  torch::manual_seed(13);
  const at::Tensor input = torch::randn({16, 6, 3}) + 2;
  at::Tensor cpu_mean = torch::zeros({6}), cpu_var = torch::ones({6});
  at::Tensor sim_mean = cpu_mean.to(sim0()), sim_var = cpu_var.to(sim0());
  const auto cpu_result = torch::batch_norm_update_stats(input, cpu_mean, cpu_var, 0.3);
  const auto sim_result = torch::batch_norm_update_stats(input.to(sim0()), sim_mean, sim_var, 0.3);
  expect_bit_identical(std::get<0>(sim_result), std::get<0>(cpu_result), "the batch's mean");
  expect_bit_identical(std::get<1>(sim_result), std::get<1>(cpu_result), "the batch's inverse deviation");
  expect_bit_identical(sim_mean, cpu_mean, "running_mean");
  expect_bit_identical(sim_var, cpu_var, "running_var");
  EXPECT_GT(cpu_mean.min().item<float>(), 0.3) << cpu_mean;
}

// ---------------------------------------------------------------- marked writes, views

TEST(SimOps, OutAndInPlaceArgumentsAreWrittenAsOnTheCpu) {
  torch::manual_seed(14);
  const at::Tensor a = torch::randn({4, 5});
  const at::Tensor b = torch::randn({4, 5});
  at::Tensor out = torch::empty({0}, torch::TensorOptions().device(sim0()));  // resized by the op
  const at::Tensor returned = torch::mul_out(out, a.to(sim0()), b.to(sim0()));
  EXPECT_TRUE(returned.is_same(out));
  expect_bit_identical(out, a * b, "mul's out");

  at::Tensor in_place = a.to(sim0());
  EXPECT_TRUE(in_place.addcmul_(b.to(sim0()), b.to(sim0()), 0.5).is_same(in_place));
  expect_bit_identical(in_place, a.addcmul(b, b, 0.5), "addcmul_'s self");

  std::vector<at::Tensor> sim_list{a.to(sim0()), b.to(sim0())};
  torch::_foreach_mul_(sim_list, 3.0);
  expect_bit_identical(sim_list[0], a * 3, "_foreach_mul_'s first");
  expect_bit_identical(sim_list[1], b * 3, "_foreach_mul_'s second");
}

// unfold has no kernel of the simulator's own: what it returns is still a view of the
// device tensor, so a write through it reaches the tensor, as on the CPU.
TEST(SimOps, AViewAnOpReturnsSharesTheDeviceTensorsMemory) {
  const at::Tensor cpu_base = torch::arange(13, torch::kFloat);
  const at::Tensor sim_base = cpu_base.to(sim0());
  at::Tensor cpu_windows = cpu_base.slice(0, 1).unfold(0, 4, 2);  // from an offset into the storage
  at::Tensor sim_windows = sim_base.slice(0, 1).unfold(0, 4, 2);
  EXPECT_TRUE(sim_windows.storage().is_alias_of(sim_base.storage()));
  expect_bit_identical(sim_windows, cpu_windows, "the windows");
  cpu_windows.select(0, 1).mul_(-1);
  sim_windows.select(0, 1).mul_(-1);
  expect_bit_identical(sim_base, cpu_base, "the base after a write through its windows");

  const at::Tensor cpu_complex = torch::randn({3}, torch::kComplexFloat);
  const at::Tensor sim_complex = cpu_complex.to(sim0());
  const at::Tensor sim_real = torch::view_as_real(sim_complex);
  EXPECT_TRUE(sim_real.storage().is_alias_of(sim_complex.storage()));
  sim_real.select(1, 1).zero_();
  expect_bit_identical(sim_complex, torch::real(cpu_complex).to(torch::kComplexFloat), "the complex tensor");
}

// ---------------------------------------------------------------- hazards

// Copies held by a gate until something waits for them: a queued one is still queued when
// the op runs, however long the test took to run it.
class SimOpsHazards : public ::testing::Test {
 protected:
  void TearDown() override {
    sim::synchronize_all();
    sim::clear_hazards();
  }
  sim::CopyGate held_;
};

// A training step writes the running statistics though the schema does not say so: a copy
// still reading them is a hazard. An evaluation step only reads them: none.
TEST_F(SimOpsHazards, AnUnmarkedWriteIsCheckedAsAWrite) {
  const c10::impl::VirtualGuardImpl guard(sim0().type());
  const c10::Stream side = guard.getStreamFromGlobalPool(sim0());
  torch::nn::BatchNorm1d norm(4);
  norm->to(sim0());
  const at::Tensor x = torch::randn({8, 4}).to(sim0());
  const at::Tensor saved_mean = torch::empty({4}).pin_memory();
  for (const bool training : {false, true}) {
    norm->train(training);
    {
      const c10::StreamGuard on_side(side);
      saved_mean.copy_(norm->running_mean, /*non_blocking=*/true);
    }
    if (!training) {
      EXPECT_NO_THROW(norm->forward(x));
      continue;
    }
    try {
      norm->forward(x);
      FAIL() << "a training step wrote the running mean a queued copy still reads";
    } catch (const sim::SimHazardError& e) {
      EXPECT_THAT(e.what(),
                  ContainsRegex("aten::native_batch_norm on stream 0 writes memory that a copy (queued|running) "
                                "on stream " +
                                std::to_string(side.id()) + " is still reading"));
    }
  }
}

#endif

}  // namespace
}  // namespace sim_ops_test
