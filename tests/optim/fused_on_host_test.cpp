// Which update runs on host fp32 tensors: the fused pass for stowage's own optimizers
// (a FusedAdamW, wrapped by the swap or not; a MasterAdamW's masters), LibTorch's
// operations for LibTorch's Adam and AdamW, wrapped or not, so that those stay bit for bit
// LibTorch's on every version. Told apart by the ATen operators a step dispatches: the
// fused pass runs none of the update's (addcdiv_ among them).

#include <stowage/optim/fused_adamw.h>
#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_optimizer.h>

#include "optim/swap_test_util.h"
#include "state/optimizer_state_key.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace stowage::optim {
namespace {

// The names of the ATen operators dispatched, on any thread, while `run` runs.
std::vector<std::string> operators_dispatched_by(const std::function<void()>& run) {
  static std::mutex mutex;
  static std::vector<std::string>* names = nullptr;
  std::vector<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mutex);
    names = &seen;
  }
  const at::CallbackHandle handle = at::addGlobalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& record) -> std::unique_ptr<at::ObserverContext> {
        std::lock_guard<std::mutex> lock(mutex);
        if (names != nullptr) names->emplace_back(record.name());
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  run();
  at::removeCallback(handle);
  std::lock_guard<std::mutex> lock(mutex);
  names = nullptr;
  return seen;
}

bool dispatched(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

const testing::Shapes kHostShapes = {{testing::kSwappedNumel * 2}, {64, 40}};

TEST(FusedOnHost, ASwappedFusedAdamWTakesTheFusedPassAndASwappedAdamWLibTorchsOperations) {
  auto fused_params = testing::make_params(kHostShapes);
  auto plain_params = testing::clone_params(fused_params);
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  auto fused = swap_optimizer(std::make_shared<FusedAdamW>(fused_params, options), SwapOptimizerConfig().swap_times(2));
  auto plain = swap_optimizer(testing::adamw(plain_params, options), SwapOptimizerConfig().swap_times(2));
  testing::set_grads(fused_params, 0);
  testing::set_grads(plain_params, 0);
  const auto fused_ops = operators_dispatched_by([&] { fused->step(); });
  const auto plain_ops = operators_dispatched_by([&] { plain->step(); });
  EXPECT_FALSE(dispatched(fused_ops, "aten::addcdiv_"));
  EXPECT_TRUE(dispatched(plain_ops, "aten::addcdiv_"));
}

TEST(FusedOnHost, MasterAdamWUpdatesItsMastersInTheFusedPass) {
  auto params = testing::make_params(kHostShapes, torch::kBFloat16);
  std::vector<torch::Tensor> masters;
  masters.reserve(params.size());
  for (const auto& p : params) masters.push_back(p.detach().to(torch::kFloat).requires_grad_());
  const auto options = torch::optim::AdamWOptions(1e-2).amsgrad(true);
  MasterAdamW master_adamw(params, options);
  FusedAdamW reference(masters, options);
  testing::set_grads(params, 0);
  for (size_t i = 0; i < params.size(); ++i) masters[i].mutable_grad() = params[i].grad().to(torch::kFloat);
  const auto ops = operators_dispatched_by([&] { master_adamw.step(); });
  reference.step();
  EXPECT_FALSE(dispatched(ops, "aten::addcdiv_"));
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& state = static_cast<const MasterAdamWParamState&>(
        *master_adamw.state().at(stowage::detail::state_key(master_adamw.state(), params[i])));
    EXPECT_TRUE(torch::equal(state.master_param(), masters[i])) << "parameter " << i;
  }
}

}  // namespace
}  // namespace stowage::optim
