// TrainingProgress: the step and both generators' states round-trip through its state
// dict and through a checkpoint, so that a loop resumed from it draws what it would have
// drawn; a state it cannot take is refused by name and changes nothing.

#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/training_progress.h>

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace stowage {
namespace {

using ::testing::HasSubstr;

// What the loop draws next: a data sample and a dropout-like draw of the default generator.
std::pair<at::Tensor, at::Tensor> draw(at::Generator& data) {
  return {at::randint(256, {16}, data), at::rand({8})};
}

TEST(TrainingProgress, ALoopResumedFromItsStateDrawsWhatItWouldHaveDrawn) {
  torch::manual_seed(3);
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto progress = c10::make_intrusive<TrainingProgress>(data);
  draw(data);
  progress->set_step(7);
  const StateDict saved = progress->state_dict();
  const auto [next_data, next_torch] = draw(data);
  draw(data);
  progress->set_step(9);
  progress->load_state_dict(saved);
  EXPECT_EQ(progress->step(), 7);
  const auto [data_again, torch_again] = draw(data);  // the loop's own handle follows
  EXPECT_TRUE(data_again.equal(next_data));
  EXPECT_TRUE(torch_again.equal(next_torch));
}

TEST(TrainingProgress, RoundTripsThroughACheckpoint) {
  const dcp::testing::ScratchDir dir;
  torch::manual_seed(5);
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(13);
  const auto progress = c10::make_intrusive<TrainingProgress>(data);
  progress->set_step(42);
  StateDict state;
  state.insert("progress", as_ivalue(progress));
  dcp::save(state, dir.path());
  const auto [next_data, next_torch] = draw(data);
  progress->set_step(43);
  dcp::load(state, dir.path());
  EXPECT_EQ(progress->step(), 42);
  const auto [data_again, torch_again] = draw(data);
  EXPECT_TRUE(data_again.equal(next_data));
  EXPECT_TRUE(torch_again.equal(next_torch));
}

TEST(TrainingProgress, AStateItCannotTakeIsRefusedByNameAndChangesNothing) {
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(17);
  const auto progress = c10::make_intrusive<TrainingProgress>(data);
  progress->set_step(3);
  const StateDict good = progress->state_dict();
  const auto variant = [&](const char* key, const c10::IValue& value) {
    StateDict state;
    for (const auto& item : good) state.insert(item.key(), item.value());
    if (value.isNone()) {
      state.erase(key);
    } else {
      state.insert_or_assign(key, value);
    }
    return state;
  };
  const std::vector<std::tuple<StateDict, std::string>> bad = {
      {variant("step", c10::IValue()), "no integer 'step'"},
      {variant("step", at::zeros({1})), "no integer 'step'"},
      {variant("data_rng", c10::IValue()), "no tensor 'data_rng'"},
      {variant("data_rng", at::zeros({5}, at::kByte)), "'data_rng' is a Byte tensor of 5 elements"},
      {variant("torch_rng", at::zeros({good.at("torch_rng").toTensor().numel()}, at::kFloat)),
       "'torch_rng' is a Float tensor"},
  };
  const at::Tensor before = data.get_state();
  for (const auto& [state, message] : bad) {
    SCOPED_TRACE(message);
    for (const bool checking : {true, false}) {
      try {
        if (checking) {
          progress->check_load_state_dict(state);
        } else {
          progress->load_state_dict(state);
        }
        ADD_FAILURE() << "took a bad state";
      } catch (const InvalidArgument& e) {
        EXPECT_THAT(e.what(), HasSubstr(message));
      }
      EXPECT_EQ(progress->step(), 3);
      EXPECT_TRUE(data.get_state().equal(before));
    }
  }
  EXPECT_THROW(TrainingProgress{at::Generator()}, InvalidArgument);
}

}  // namespace
}  // namespace stowage
