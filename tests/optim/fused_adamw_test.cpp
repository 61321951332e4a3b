// FusedAdamW against LibTorch's AdamW (and the fused update against Adam): the same
// update within a stated rounding bound over sizes (the vector tail, several threads' chunks),
// options and steps; every CPU capability's kernel bit for bit equal to the others; a
// parameter it can't take is refused by name before anything changes; and its state is
// AdamW's.

#include <stowage/error.h>
#include <stowage/optim/fused_adamw.h>

#include "optim/adam_update.h"
#include "optim/fused_adam.h"
#include "optim/fused_adam_kernel.h"
#include "state/optimizer_state_key.h"

#include <torch/optim/adam.h>
#include <torch/serialize.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>

namespace stowage::optim {
namespace {

// Each element of a step's result may differ from LibTorch's by this many fp32 epsilons of
// its scale: |before| + |after - before|, what the step read and what it added (a
// cancellation leaves a result far smaller than the rounding of what made it). Measured
// on this machine (2026-12-05): 0 on Debian's 1.13, bit for bit; at most 2.07 on the 2.11
// wheel, whose fp32 sqrt is not always correctly rounded (18% of elements differ from the
// IEEE square root, by an ulp, which the division and the step carry on); at most 0.96
// between the default kernel and the AVX ones.
constexpr double kEpsilonBound = 4;

// The largest |fused - reference| over the elements, in fp32 epsilons of each element's
// scale (above).
double max_relative_error(const at::Tensor& fused, const at::Tensor& reference, const at::Tensor& before) {
  const at::Tensor r = reference.detach().to(at::kDouble);
  const at::Tensor b = before.detach().to(at::kDouble);
  const at::Tensor scale = (b.abs() + (r - b).abs()) * std::numeric_limits<float>::epsilon();
  const at::Tensor error = (fused.detach().to(at::kDouble) - r).abs();
  // An element whose scale is 0 must be exact.
  return at::where(scale > 0, error / scale, error * 1e30).max().item<double>();
}

std::vector<at::Tensor> random_fused_params(const std::vector<int64_t>& sizes, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  std::vector<at::Tensor> params;
  params.reserve(sizes.size());
  for (const int64_t size : sizes) params.push_back(at::randn({size}).requires_grad_(true));
  return params;
}

std::vector<at::Tensor> param_copies(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// The same gradients, step by step, on both lists: varied in scale so that eps matters
// for some elements.
void set_same_grads(std::vector<at::Tensor>& a, std::vector<at::Tensor>& b, int step) {
  at::manual_seed(1000 + step);
  for (size_t i = 0; i < a.size(); ++i) {
    const at::Tensor grad = at::randn_like(a[i]) * at::pow(10.0, at::randint(-9, 2, a[i].sizes()).to(at::kFloat));
    a[i].mutable_grad() = grad.clone();
    b[i].mutable_grad() = grad.clone();
  }
}

template <typename StateMap>
const torch::optim::AdamWParamState& adamw_state(StateMap& states, const at::Tensor& param) {
  return static_cast<const torch::optim::AdamWParamState&>(*states.at(stowage::detail::state_key(states, param)));
}

struct FusedCase {
  const char* name;
  torch::optim::AdamWOptions options;
};

void PrintTo(const FusedCase& c, std::ostream* out) {
  *out << c.name;
}

class FusedAdamWAgainstAdamW : public ::testing::TestWithParam<FusedCase> {};

// 1..17 cover a vector's tail on each width; 100003 is split over the threads' chunks.
TEST_P(FusedAdamWAgainstAdamW, EveryStepWithinTheRoundingBound) {
  const std::vector<int64_t> sizes{1, 7, 8, 15, 16, 17, 33, 1000, 100003};
  std::vector<at::Tensor> fused_params = random_fused_params(sizes, 7);
  std::vector<at::Tensor> reference_params = param_copies(fused_params);
  FusedAdamW fused(fused_params, GetParam().options);
  torch::optim::AdamW reference(reference_params, GetParam().options);
  for (int step = 0; step < 6; ++step) {
    set_same_grads(fused_params, reference_params, step);
    std::vector<std::vector<at::Tensor>> before;
    for (const auto& p : reference_params) {
      const auto* state = step == 0 ? nullptr : &adamw_state(reference.state(), p);
      const auto moment = [&](const at::Tensor& t) { return state ? t.clone() : at::zeros_like(p); };
      before.push_back({p.detach().clone(), moment(state ? state->exp_avg() : p),
                        moment(state ? state->exp_avg_sq() : p),
                        moment(state && state->max_exp_avg_sq().defined() ? state->max_exp_avg_sq() : p)});
    }
    fused.step();
    reference.step();
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto& f = adamw_state(fused.state(), fused_params[i]);
      const auto& r = adamw_state(reference.state(), reference_params[i]);
      ASSERT_EQ(f.step(), r.step());
      const double worst = std::max({max_relative_error(fused_params[i], reference_params[i], before[i][0]),
                                     max_relative_error(f.exp_avg(), r.exp_avg(), before[i][1]),
                                     max_relative_error(f.exp_avg_sq(), r.exp_avg_sq(), before[i][2])});
      ASSERT_LE(worst, kEpsilonBound) << "size " << sizes[i] << ", step " << step;
      if (GetParam().options.amsgrad()) {
        ASSERT_LE(max_relative_error(f.max_exp_avg_sq(), r.max_exp_avg_sq(), before[i][3]), kEpsilonBound);
      }
      // Each step starts again from the reference's result, so that the bound is a step's.
      fused_params[i].detach().copy_(reference_params[i].detach());
      for (const auto& [to, from] : {std::pair{&f.exp_avg(), &r.exp_avg()},
                                     {&f.exp_avg_sq(), &r.exp_avg_sq()},
                                     {&f.max_exp_avg_sq(), &r.max_exp_avg_sq()}}) {
        if (to->defined()) to->copy_(*from);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, FusedAdamWAgainstAdamW,
    ::testing::Values(FusedCase{"Defaults", torch::optim::AdamWOptions(1e-3)},
                      FusedCase{"NoWeightDecay", torch::optim::AdamWOptions(1e-2).weight_decay(0)},
                      FusedCase{"Amsgrad", torch::optim::AdamWOptions(3e-3).amsgrad(true).weight_decay(0.1)},
                      FusedCase{"Betas", torch::optim::AdamWOptions(1e-1).betas({0.5, 0.9}).eps(1e-6)}),
    [](const ::testing::TestParamInfo<FusedCase>& info) { return info.param.name; });

// Adam's L2 term (weight decay added to the gradient) through the same kernel.
TEST(FusedAdamUpdate, AdamsWeightDecayWithinTheRoundingBound) {
  std::vector<at::Tensor> fused_params = random_fused_params({1000, 9}, 3);
  std::vector<at::Tensor> reference_params = param_copies(fused_params);
  const auto options = torch::optim::AdamOptions(1e-2).weight_decay(0.05);
  torch::optim::Adam reference(reference_params, options);
  const detail::AdamHyperParams hyper =
      detail::adam_hyper_params(options, /*decoupled_weight_decay=*/false, /*fused_on_host=*/true);
  set_same_grads(fused_params, reference_params, 0);
  const std::vector<at::Tensor> before = param_copies(reference_params);
  reference.step();
  for (size_t i = 0; i < fused_params.size(); ++i) {
    const at::Tensor p = fused_params[i].detach();
    const at::Tensor m = at::zeros_like(p);
    const at::Tensor v = at::zeros_like(p);
    detail::fused_adam_update(p, fused_params[i].grad(), m, v, {}, 1, hyper);
    EXPECT_LE(max_relative_error(p, reference_params[i], before[i]), kEpsilonBound);
  }
}

// -ffp-contract=off and one order of operations: the width of a vector changes nothing
// where the CPU fuses a multiply and an add (AVX2, AVX-512). The default copy rounds them
// apart, as ATen's default kernels do: within the bound.
TEST(FusedAdamKernel, EveryCapabilityThisCpuRunsAgrees) {
  constexpr int64_t kSize = 1003;
  at::manual_seed(5);
  const at::Tensor param = at::randn({kSize});
  const at::Tensor grad = at::randn({kSize});
  const at::Tensor exp_avg = at::randn({kSize});
  const at::Tensor exp_avg_sq = at::rand({kSize});
  const at::Tensor max_exp_avg_sq = at::rand({kSize});
  detail::FusedAdamScalars scalars;
  scalars.beta1 = 0.9F, scalars.one_minus_beta1 = 0.1F, scalars.beta2 = 0.999F, scalars.one_minus_beta2 = 0.001F;
  scalars.decay_param = true, scalars.param_decay = 0.99F, scalars.amsgrad = true;
  scalars.bias_correction2_sqrt = 0.3F, scalars.eps = 1e-8F, scalars.neg_step_size = -0.01F;
  const auto run_on = [&](detail::CpuCapability capability) {
    std::vector<at::Tensor> out{param.clone(), exp_avg.clone(), exp_avg_sq.clone(), max_exp_avg_sq.clone()};
    const detail::FusedAdamRun run{out[0].data_ptr<float>(), grad.data_ptr<float>(),   out[1].data_ptr<float>(),
                                   out[2].data_ptr<float>(), out[3].data_ptr<float>(), kSize};
    detail::fused_adam_kernel(capability)(run, scalars);
    return out;
  };
  const std::vector<at::Tensor> by_default = run_on(detail::CpuCapability::kDefault);
  EXPECT_FALSE(at::equal(by_default[0], param));
  std::vector<std::vector<at::Tensor>> fused_multiply_add;
  for (const auto capability : {detail::CpuCapability::kAvx2, detail::CpuCapability::kAvx512}) {
    if (detail::cpu_runs(capability)) fused_multiply_add.push_back(run_on(capability));
  }
  if (fused_multiply_add.empty()) GTEST_SKIP() << "this CPU runs neither AVX2 nor AVX-512";
  const std::vector<at::Tensor> before{param, exp_avg, exp_avg_sq, max_exp_avg_sq};
  for (size_t t = 0; t < before.size(); ++t) {
    EXPECT_LE(max_relative_error(by_default[t], fused_multiply_add[0][t], before[t]), kEpsilonBound) << t;
    for (const auto& other : fused_multiply_add) EXPECT_TRUE(at::equal(other[t], fused_multiply_add[0][t])) << t;
  }
}

TEST(FusedAdamWErrors, AParameterItCantTakeIsNamedAndNothingChanges) {
  std::vector<at::Tensor> params{at::randn({5}).requires_grad_(true),
                                 at::randn({4}).to(at::kBFloat16).requires_grad_(true)};
  for (auto& p : params) p.mutable_grad() = at::ones_like(p);
  const at::Tensor before = params[0].detach().clone();
  FusedAdamW optimizer(params, torch::optim::AdamWOptions(1e-2));
  try {
    optimizer.step();
    FAIL() << "a bf16 parameter was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 1 of group 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("BFloat16"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(params[0], before));
  EXPECT_TRUE(optimizer.state().empty());
}

TEST(FusedAdamWErrors, AmsgradTurnedOnAfterTheStateWasMadeIsRefusedBeforeAnyUpdate) {
  std::vector<at::Tensor> params{at::randn({5}).requires_grad_(true)};
  params[0].mutable_grad() = at::ones_like(params[0]);
  FusedAdamW optimizer(params, torch::optim::AdamWOptions(1e-2));
  optimizer.step();
  static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).amsgrad(true);
  const at::Tensor before = params[0].detach().clone();
  EXPECT_THROW(optimizer.step(), InvalidArgument);
  EXPECT_TRUE(at::equal(params[0], before));
}

// Saved by FusedAdamW, loaded by LibTorch's AdamW: the same state.
TEST(FusedAdamWState, AdamWLoadsWhatItSaves) {
  std::vector<at::Tensor> params = random_fused_params({10, 3}, 9);
  std::vector<at::Tensor> others = param_copies(params);
  FusedAdamW fused(params, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  set_same_grads(params, others, 0);
  fused.step();
  std::stringstream saved;
  torch::save(fused, saved);
  torch::optim::AdamW loaded(others, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  torch::load(loaded, saved);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& f = adamw_state(fused.state(), params[i]);
    const auto& l = adamw_state(loaded.state(), others[i]);
    EXPECT_EQ(f.step(), l.step());
    EXPECT_TRUE(at::equal(f.exp_avg(), l.exp_avg()));
    EXPECT_TRUE(at::equal(f.max_exp_avg_sq(), l.max_exp_avg_sq()));
  }
}

}  // namespace
}  // namespace stowage::optim
