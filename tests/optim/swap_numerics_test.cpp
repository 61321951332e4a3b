// The swap optimizer's parameters and states equal the unwrapped optimizer's bit for bit.

#include <stowage/optim/fused_adamw.h>

#include "optim/param_state.h"
#include "optim/swap_test_util.h"

namespace stowage::optim {
namespace {

using testing::clone_params;
using testing::make_params;
using testing::set_grads;

// Mixed sizes: {100} and {10} are below min_numel and stay on the device; parameter 2
// has no gradient on steps 3 to 5, parameter 5 only on even steps, parameter 6 never.
const testing::Shapes kMixedShapes = {{3000}, {40, 50}, {100}, {2048}, {64, 33}, {10}, {1500}};

bool has_grad(size_t i, int step) {
  if (i == 2) return step < 3 || step > 5;
  if (i == 5) return step % 2 == 0;
  return i != 6;
}

struct Case {
  std::string name;
  torch::Dtype dtype;
  std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> make;
  SwapOptimizerConfig config;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::vector<torch::optim::OptimizerParamGroup> two_groups(const std::vector<torch::Tensor>& params,
                                                          std::unique_ptr<torch::optim::OptimizerOptions> first,
                                                          std::unique_ptr<torch::optim::OptimizerOptions> second) {
  std::vector<torch::Tensor> a(params.begin(), params.begin() + 3);
  std::vector<torch::Tensor> b(params.begin() + 3, params.end());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(a, std::move(first));
  groups.emplace_back(b, std::move(second));
  return groups;
}

std::vector<Case> cases() {
  using torch::optim::AdamOptions;
  using torch::optim::AdamWOptions;
  std::vector<Case> out;
  out.push_back({"Adam", torch::kFloat,
                 [](auto p) { return std::make_shared<torch::optim::Adam>(p, AdamOptions(1e-2).weight_decay(0.01)); },
                 SwapOptimizerConfig().swap_times(3)});
  out.push_back({"AdamW", torch::kFloat,
                 [](auto p) { return std::make_shared<torch::optim::AdamW>(p, AdamWOptions(1e-2)); },
                 SwapOptimizerConfig().swap_times(3)});
  out.push_back({"AmsGrad", torch::kFloat,
                 [](auto p) { return std::make_shared<torch::optim::Adam>(p, AdamOptions(1e-2).amsgrad(true)); },
                 SwapOptimizerConfig().swap_times(4)});
  out.push_back({"AdamWGroups", torch::kFloat,
                 [](auto p) {
                   return std::make_shared<torch::optim::AdamW>(
                       two_groups(p, std::make_unique<AdamWOptions>(AdamWOptions(1e-2).weight_decay(0.1)),
                                  std::make_unique<AdamWOptions>(AdamWOptions(3e-3).amsgrad(true))),
                       AdamWOptions(1e-3));
                 },
                 SwapOptimizerConfig().swap_times(2)});
  out.push_back({"AdamDouble", torch::kDouble,
                 [](auto p) { return std::make_shared<torch::optim::Adam>(p, AdamOptions(1e-2)); },
                 SwapOptimizerConfig().swap_times(16)});
  out.push_back({"MasterAdamWBf16", torch::kBFloat16,
                 [](auto p) { return std::make_shared<MasterAdamW>(p, AdamWOptions(1e-2)); },
                 SwapOptimizerConfig().swap_times(3)});
  out.push_back({"MasterAdamWBf16SwappedMasters", torch::kBFloat16,
                 [](auto p) { return std::make_shared<MasterAdamW>(p, AdamWOptions(1e-2).amsgrad(true)); },
                 SwapOptimizerConfig().swap_times(3).include_master_params(true)});
  // The fused pass on the host: the swap updates as the FusedAdamW it wraps does.
  out.push_back({"FusedAdamW", torch::kFloat,
                 [](auto p) { return std::make_shared<FusedAdamW>(p, AdamWOptions(1e-2).weight_decay(0.05)); },
                 SwapOptimizerConfig().swap_times(3)});
  out.push_back({"FusedAdamWAmsgrad", torch::kFloat,
                 [](auto p) { return std::make_shared<FusedAdamW>(p, AdamWOptions(1e-2).amsgrad(true)); },
                 SwapOptimizerConfig().swap_times(4)});
  out.push_back({"OnlyExpAvgSwapped", torch::kFloat,
                 [](auto p) { return std::make_shared<torch::optim::AdamW>(p, AdamWOptions(1e-2)); },
                 SwapOptimizerConfig().swap_times(5).state_keys({"exp_avg"})});
  return out;
}

class SwapNumerics : public ::testing::TestWithParam<std::tuple<Case, testing::SwapMode>> {};

TEST_P(SwapNumerics, TenStepsMatchTheUnwrappedOptimizerBitForBit) {
  const auto& [c, mode] = GetParam();
  auto plain_params = make_params(kMixedShapes, c.dtype);
  auto swap_params = clone_params(plain_params);
  auto plain = c.make(plain_params);
  auto swap = swap_optimizer(c.make(swap_params), mode.apply(c.config));
  for (int step = 0; step < 10; ++step) {
    set_grads(plain_params, step, has_grad);
    set_grads(swap_params, step, has_grad);
    plain->step();
    swap->step();
  }
  testing::expect_params_equal(plain_params, swap_params);
  testing::expect_state_dicts_equal(testing::plain_state_dict(plain), swap->state_dict());
  // The masters make a difference for bf16: a plain bf16 AdamW would have rounded away
  // updates, so this also checks that the masters were used.
  if (c.dtype == torch::kBFloat16) {
    auto bf16_params = make_params(kMixedShapes, c.dtype);
    torch::optim::AdamW bf16(bf16_params, torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 10; ++step) {
      set_grads(bf16_params, step, has_grad);
      bf16.step();
    }
    EXPECT_FALSE(torch::equal(bf16_params[0], swap_params[0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SwapNumerics,
                         ::testing::Combine(::testing::ValuesIn(cases()), ::testing::ValuesIn(testing::swap_modes())),
                         [](const auto& info) { return std::get<0>(info.param).name + std::get<1>(info.param).name; });

}  // namespace
}  // namespace stowage::optim
