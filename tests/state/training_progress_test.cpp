// TrainingProgress: the step and both generators' states round-trip through its state
// dict and through a checkpoint, so that a loop resumed from it draws what it would have
// drawn; a state it cannot take is refused by name and changes nothing.

#include "dcp/test_util.h"
#include "test_device.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/error.h>
#include <stowage/state/training_progress.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
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

// Dropout on a device draws from the device's generator: a resume that restores only the
// CPU's drops other activations (a user's loop on sim resumed to other parameters).
TEST(TrainingProgress, KeepsTheGeneratorOfTheDeviceTheLoopRunsOn) {
  const c10::Device device = testing::test_device();
  if (device.is_cpu()) GTEST_SKIP() << "no device in this build: the CPU generator is tested above";
  torch::manual_seed(19);
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(23);
  const auto progress = c10::make_intrusive<TrainingProgress>(data, std::vector<c10::Device>{device});
  const auto dropout_mask = [&] { return at::dropout(at::ones({64}, at::TensorOptions(device)), 0.5, true).cpu(); };
  dropout_mask();
  const StateDict saved = progress->state_dict();
  EXPECT_TRUE(saved.contains("device_rng_" + c10::DeviceTypeName(device.type(), true)));
  const at::Tensor next = dropout_mask();
  dropout_mask();
  progress->load_state_dict(saved);
  EXPECT_TRUE(dropout_mask().equal(next));
}

// A checkpoint from before device generators were kept still resumes, with a warning; the
// device's generator goes on as it is.
TEST(TrainingProgress, AStateWithoutTheDevicesGeneratorLeavesItAsItIs) {
  const c10::Device device = testing::test_device();
  if (device.is_cpu()) GTEST_SKIP() << "no device in this build";
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(31);
  const auto progress = c10::make_intrusive<TrainingProgress>(data, std::vector<c10::Device>{device});
  progress->set_step(4);
  StateDict old_format = progress->state_dict();
  old_format.erase("device_rng_" + c10::DeviceTypeName(device.type(), true));
  const at::Tensor device_state = at::globalContext().defaultGenerator(device).get_state();
  progress->set_step(9);
  progress->load_state_dict(old_format);
  EXPECT_EQ(progress->step(), 4);
  EXPECT_TRUE(at::globalContext().defaultGenerator(device).get_state().equal(device_state));
}

TEST(TrainingProgress, RefusesTwoDevicesOfOneType) {
  const c10::Device device = testing::test_device();
  if (device.is_cpu()) GTEST_SKIP() << "no device in this build";
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(29);
  try {
    TrainingProgress progress(data, {device, device});
    ADD_FAILURE() << "took two devices of one type";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("two devices of type"));
  }
}

}  // namespace
}  // namespace stowage
