// Faults inside the swap optimizer's step: copies that fail and updates that throw
// (through testing::FaultInjectionSwapEnv, the optimizer's SwapEnv), at several
// batch positions. After each: the exception names the cause, nothing is left running or
// allocated, every state matches its parameter, and the optimizer goes on exactly as a
// plain AdamW that skipped the parameters which were not updated.

#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include "optim/fault_injection_swap_env.h"
#include "optim/swap_test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace stowage::optim {
namespace {

using memory::CopyLane;
using testing::clone_params;
using testing::expect_params_equal;
using testing::expect_state_dicts_equal;
using ::testing::HasSubstr;
using testing::kSwappedNumel;
using testing::make_params;
using ::testing::Not;
using testing::plain_state_dict;
using testing::set_grads;

constexpr size_t kParams = 8;
constexpr int64_t kSwapTimes = 4;  // equal sizes: batch b holds parameters 2b and 2b + 1
constexpr size_t kPerBatch = kParams / kSwapTimes;
constexpr int kStepsBefore = 2;

std::shared_ptr<torch::optim::AdamW> decaying_adamw(const std::vector<torch::Tensor>& params) {
  return testing::adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

// A swap optimizer and a plain AdamW that have taken the same steps.
struct Pair {
  explicit Pair(const testing::SwapMode& mode)
      : params(make_params(testing::Shapes(kParams, {kSwappedNumel}))), plain_params(clone_params(params)) {
    swap = swap_optimizer(decaying_adamw(params), mode.apply(SwapOptimizerConfig().swap_times(kSwapTimes).env(&env)));
    plain = decaying_adamw(plain_params);
    for (int step = 0; step < kStepsBefore; ++step) this->step(step);
  }
  void step(int step) {
    set_grads(params, step);
    set_grads(plain_params, step);
    swap->step();
    plain->step();
  }
  // The parameters whose step count has reached `count`, in order.
  std::vector<size_t> stepped_to(int64_t count) {
    std::vector<size_t> out;
    const auto state = swap->state_dict().at("state").toGenericDict();
    for (size_t i = 0; i < kParams; ++i) {
      if (state.at(std::to_string(i)).toGenericDict().at("step").toInt() == count) out.push_back(i);
    }
    return out;
  }
  void expect_matches_plain() {
    expect_params_equal(plain_params, params);
    expect_state_dicts_equal(plain_state_dict(plain), swap->state_dict());
  }

  testing::FaultInjectionSwapEnv env;  // before `swap`, which uses it until destroyed
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> plain_params;
  c10::intrusive_ptr<SwapOptimizer> swap;
  std::shared_ptr<torch::optim::AdamW> plain;
};

// Fails copies number `first` to `last` (counted from the start of the step) on `lane`,
// after writing NaN over the first half of the destination.
void inject_copy_faults(Pair& pair, CopyLane lane, int64_t first, int64_t last) {
  const memory::CopyStats base = pair.swap->copy_stats();
  const int64_t offset = lane == CopyLane::kHostToDevice ? base.h2d_copies : base.d2h_copies;
  pair.env.set_copy_fault([=](CopyLane at, int64_t number, const at::Tensor& dst) {
    if (at != lane || number - offset < first || number - offset > last) return;
    dst.view(-1).narrow(0, 0, dst.numel() / 2).fill_(std::numeric_limits<float>::quiet_NaN());
    throw std::runtime_error("injected copy fault");
  });
}

struct Outcome {
  std::string message;
  int64_t bytes_before = 0;  // device memory before the failed step
  int64_t leaked_bytes = 0;  // device memory after the failed step, minus before it
};

Outcome failing_step(Pair& pair, int step) {
  set_grads(pair.params, step);
  Outcome outcome;
  outcome.bytes_before = memory::memory_allocated();
  try {
    pair.swap->step();
    ADD_FAILURE() << "step() did not throw";
  } catch (const Error& e) {
    outcome.message = e.what();
  }
  outcome.leaked_bytes = memory::memory_allocated() - outcome.bytes_before;
  pair.env.set_copy_fault(nullptr);
  pair.env.set_update_fault(nullptr);
  // Nothing is left running or failed in the engine.
  EXPECT_EQ(pair.swap->copy_engine().drain(), nullptr);
  return outcome;
}

// The plain AdamW takes the failed step with gradients for `updated` only, then both go
// on normally; they must agree after each step, and the swap must be back to holding no
// state on the device.
void expect_consistent_after(Pair& pair, int step, const std::vector<size_t>& updated, const Outcome& outcome) {
  set_grads(pair.plain_params, step,
            [&](size_t i, int) { return std::find(updated.begin(), updated.end(), i) != updated.end(); });
  pair.plain->step();
  pair.expect_matches_plain();
  pair.step(step + 1);
  EXPECT_EQ(memory::memory_allocated(), outcome.bytes_before);
  pair.expect_matches_plain();
  pair.step(step + 2);
  pair.expect_matches_plain();
}

std::vector<size_t> first_params(size_t count) {
  std::vector<size_t> out;
  for (size_t i = 0; i < std::min(count, kParams); ++i) out.push_back(i);
  return out;
}

class SwapFaults : public ::testing::TestWithParam<testing::SwapMode> {
 protected:
  void SetUp() override { memory::enable_accounting(); }
  bool packed() const { return GetParam().packed; }
  // Copies per batch per direction: one per dtype packed, one per state per tensor.
  int64_t copies_per_batch() const { return packed() ? 1 : 2 * kPerBatch; }
};

TEST_P(SwapFaults, AFailedUploadStopsTheStepBeforeItsBatch) {
  for (int64_t batch = 0; batch < kSwapTimes; ++batch) {
    SCOPED_TRACE("upload of batch " + std::to_string(batch));
    Pair pair(GetParam());
    const int64_t copy = batch * copies_per_batch() + (packed() ? 0 : 1);
    inject_copy_faults(pair, CopyLane::kHostToDevice, copy, copy);
    const Outcome outcome = failing_step(pair, kStepsBefore);
    EXPECT_THAT(outcome.message, HasSubstr("injected copy fault"));
    EXPECT_THAT(outcome.message, HasSubstr(fmt::format("stopped in batch {} of {}", batch, kSwapTimes)));
    EXPECT_EQ(outcome.leaked_bytes, 0);
    const std::vector<size_t> updated = first_params(batch * kPerBatch);
    EXPECT_EQ(pair.stepped_to(kStepsBefore + 1), updated);
    expect_consistent_after(pair, kStepsBefore, updated, outcome);
  }
}

// A failed download fails the upload lane when it waits for it (packed: the upload of
// batch + 2 into the same arena; per tensor: the compute side waits for it one batch
// later), so the updates stop two batches on, and the failed batches are downloaded again.
TEST_P(SwapFaults, AFailedDownloadIsDoneAgainFromTheDevice) {
  for (int64_t batch = 0; batch < kSwapTimes; ++batch) {
    SCOPED_TRACE("download of batch " + std::to_string(batch));
    Pair pair(GetParam());
    const int64_t copy = batch * copies_per_batch() + (packed() ? 0 : 2);
    inject_copy_faults(pair, CopyLane::kDeviceToHost, copy, copy);
    const Outcome outcome = failing_step(pair, kStepsBefore);
    EXPECT_THAT(outcome.message, HasSubstr("injected copy fault"));
    EXPECT_THAT(outcome.message, HasSubstr("were downloaded again"));
    EXPECT_EQ(outcome.leaked_bytes, 0);
    const std::vector<size_t> updated = first_params((batch + 2) * kPerBatch);
    EXPECT_EQ(pair.stepped_to(kStepsBefore + 1), updated);
    expect_consistent_after(pair, kStepsBefore, updated, outcome);
  }
}

TEST_P(SwapFaults, StatesThatCannotBeDownloadedStayOnTheDeviceUntilTheNextStep) {
  Pair pair(GetParam());
  // Every download from the second batch's on fails, the retries too.
  inject_copy_faults(pair, CopyLane::kDeviceToHost, copies_per_batch(), 1000);
  const Outcome outcome = failing_step(pair, kStepsBefore);
  EXPECT_THAT(outcome.message, HasSubstr("could not be downloaded and stay on the device"));
  // Batches 1 and 2 (updated; batch 3's upload waited for batch 1's download).
  EXPECT_EQ(outcome.leaked_bytes, 2 * kPerBatch * 2 * kSwappedNumel * 4);
  const std::vector<size_t> updated = first_params(3 * kPerBatch);
  EXPECT_EQ(pair.stepped_to(kStepsBefore + 1), updated);
  expect_consistent_after(pair, kStepsBefore, updated, outcome);  // the next step moves them to the host
}

TEST_P(SwapFaults, AnUpdateThatThrowsLeavesItsParameterAndTheRestUnchanged) {
  for (const int64_t failing : {0, 3, 4, 7}) {
    SCOPED_TRACE("update of parameter " + std::to_string(failing));
    Pair pair(GetParam());
    pair.env.set_update_fault([failing](int64_t index) {
      if (index == failing) throw std::runtime_error("injected update fault");
    });
    const Outcome outcome = failing_step(pair, kStepsBefore);
    EXPECT_THAT(outcome.message, HasSubstr("injected update fault"));
    EXPECT_THAT(outcome.message,
                HasSubstr(fmt::format("stopped in batch {} of {}", failing / int64_t(kPerBatch), kSwapTimes)));
    EXPECT_EQ(outcome.leaked_bytes, 0);
    const std::vector<size_t> updated = first_params(failing);
    EXPECT_EQ(pair.stepped_to(kStepsBefore + 1), updated);
    expect_consistent_after(pair, kStepsBefore, updated, outcome);
  }
}

TEST_P(SwapFaults, AMismatchedGradientIsRejectedBeforeAnythingChanges) {
  Pair pair(GetParam());
  for (const auto& bad : {torch::randn({kSwappedNumel}, torch::kDouble), torch::randn({kSwappedNumel / 2})}) {
    set_grads(pair.params, kStepsBefore);
    pair.params[5].mutable_grad() = bad;
    const memory::CopyStats copies = pair.swap->copy_stats();
    try {
      pair.swap->step();
      ADD_FAILURE() << "step() did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("gradient of parameter 5 of param group 0"));
    }
    EXPECT_EQ(pair.swap->copy_stats().h2d_copies, copies.h2d_copies);
    EXPECT_EQ(pair.stepped_to(kStepsBefore), first_params(kParams));
  }
  pair.expect_matches_plain();  // nothing changed
  pair.step(kStepsBefore);
  pair.expect_matches_plain();
}

// LibTorch's c10::Error carries a C++ backtrace of several KB in what(); the step's
// error embeds the message alone.
TEST_P(SwapFaults, AnUpdateFailingWithAC10ErrorIsReportedWithoutLibTorchsBacktrace) {
  Pair pair(GetParam());
  pair.env.set_update_fault([](int64_t index) { TORCH_CHECK(index != 2, "injected c10 fault"); });
  const Outcome outcome = failing_step(pair, kStepsBefore);
  EXPECT_THAT(outcome.message, HasSubstr("injected c10 fault"));
  EXPECT_THAT(outcome.message, Not(HasSubstr("Exception raised from")));
  EXPECT_THAT(outcome.message, Not(HasSubstr("frame #")));
  expect_consistent_after(pair, kStepsBefore, first_params(2), outcome);
}

// The wrapped optimizer's param groups can change after wrapping; step() checks them as
// the constructor does, before anything changes.
TEST_P(SwapFaults, AParameterListedTwiceAfterWrappingIsRejectedBeforeAnythingChanges) {
  {
    SCOPED_TRACE("through add_param_group before the first step");
    auto params = make_params(testing::Shapes(kParams, {kSwappedNumel}));
    auto plain_params = clone_params(params);
    auto swap = swap_optimizer(decaying_adamw(params), GetParam().apply(SwapOptimizerConfig().swap_times(kSwapTimes)));
    swap->optimizer().add_param_group(torch::optim::OptimizerParamGroup({params[3]}));
    set_grads(params, 0);
    try {
      swap->step();
      ADD_FAILURE() << "step() did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 0 of param group 1 is also parameter 3 of param group 0"));
    }
    EXPECT_TRUE(swap->optimizer().state().empty());
    expect_params_equal(plain_params, params);
    swap->param_groups().pop_back();
    auto plain = decaying_adamw(plain_params);
    set_grads(plain_params, 0);
    swap->step();
    plain->step();
    expect_params_equal(plain_params, params);
  }
  SCOPED_TRACE("in the params of a group, after steps");
  Pair pair(GetParam());
  pair.swap->param_groups()[0].params().push_back(pair.params[5]);
  set_grads(pair.params, kStepsBefore);
  const memory::CopyStats copies = pair.swap->copy_stats();
  try {
    pair.swap->step();
    ADD_FAILURE() << "step() did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter 8 of param group 0 is also parameter 5 of param group 0"));
  }
  EXPECT_EQ(pair.swap->copy_stats().h2d_copies, copies.h2d_copies);
  EXPECT_EQ(pair.stepped_to(kStepsBefore), first_params(kParams));
  pair.swap->param_groups()[0].params().pop_back();
  pair.expect_matches_plain();  // nothing changed
  pair.step(kStepsBefore);
  pair.expect_matches_plain();
}

TEST_P(SwapFaults, AParameterOnAnotherDeviceAddedAfterWrappingIsRejectedBeforeAnythingChanges) {
  Pair pair(GetParam());
  const auto meta = torch::TensorOptions().device(c10::kMeta);
  torch::Tensor elsewhere = torch::zeros({kSwappedNumel}, meta).requires_grad_();
  pair.swap->optimizer().add_param_group(torch::optim::OptimizerParamGroup({elsewhere}));
  set_grads(pair.params, kStepsBefore);
  elsewhere.mutable_grad() = torch::ones({kSwappedNumel}, meta);
  try {
    pair.swap->step();
    ADD_FAILURE() << "step() did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter 0 of param group 1 is on meta"));
  }
  EXPECT_EQ(pair.stepped_to(kStepsBefore), first_params(kParams));
  pair.swap->param_groups().pop_back();
  pair.expect_matches_plain();  // nothing changed
  pair.step(kStepsBefore);
  pair.expect_matches_plain();
}

TEST_P(SwapFaults, AmsgradTurnedOffWhenItsStateIsToBeSwappedIsRejectedAtStep) {
  auto params = make_params(testing::Shapes(kParams, {kSwappedNumel}));
  auto inner = std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  auto swap = swap_optimizer(inner, GetParam().apply(SwapOptimizerConfig().state_keys({"max_exp_avg_sq"})));
  static_cast<torch::optim::AdamWOptions&>(swap->param_groups()[0].options()).amsgrad(false);
  set_grads(params, 0);
  EXPECT_THROW(swap->step(), InvalidArgument);
  EXPECT_TRUE(swap->optimizer().state().empty());
}

INSTANTIATE_TEST_SUITE_P(Modes, SwapFaults, ::testing::ValuesIn(testing::swap_modes()), testing::mode_name);

}  // namespace
}  // namespace stowage::optim
