// A load that fails changes nothing: every entry, a Stateful's included, and every
// destination is checked in the planning pass, before the first byte is written.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::state_of;

// Expects `fn` to throw stowage::InvalidArgument whose message holds every one of `parts`.
template <typename Fn>
void expect_invalid_naming(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
    }
  }
}

// Six parameters, so that they split into groups of several sizes.
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::Linear(8, 8), torch::nn::Linear(8, 1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer) {
  torch::manual_seed(1);
  for (int i = 0; i < 3; ++i) {
    const at::Tensor x = torch::randn({16, 6});
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), x.sum(1, true).cos()).backward();
    optimizer.step();
  }
}

// An AdamW over `model` whose param groups hold `sizes` parameters each, in order.
std::shared_ptr<torch::optim::AdamW> adamw_in_groups(torch::nn::Sequential& model, const std::vector<size_t>& sizes) {
  const std::vector<at::Tensor> params = model->parameters();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  size_t next = 0;
  for (size_t size : sizes) {
    groups.emplace_back(std::vector<at::Tensor>(params.begin() + next, params.begin() + next + size),
                        std::make_unique<torch::optim::AdamWOptions>(1e-2));
    next += size;
  }
  return std::make_shared<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(1e-2));
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

void expect_unchanged(const std::vector<at::Tensor>& before, const std::vector<at::Tensor>& now) {
  ASSERT_EQ(before.size(), now.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], now[i])) << "parameter " << i;
}

// Saves {"model", "optim" (AdamW in `saved_groups`), "step": 3}, then loads it into a
// fresh model and an AdamW in `loaded_groups`: the load must fail naming "optim" and
// `cause`, and leave the model, the optimizer and "step" as they were.
void expect_group_mismatch_changes_nothing(const std::vector<size_t>& saved_groups,
                                           const std::vector<size_t>& loaded_groups, const std::string& cause) {
  torch::manual_seed(0);
  auto model = make_model();
  auto optimizer = adamw_in_groups(model, saved_groups);
  train(model, *optimizer);
  const ScratchDir dir;
  save(state_of({{"model", as_ivalue(model.ptr())}, {"optim", as_ivalue(optimizer)}, {"step", int64_t(3)}}),
       dir.path());

  torch::manual_seed(7);
  auto fresh = make_model();
  auto fresh_optimizer = adamw_in_groups(fresh, loaded_groups);
  const std::vector<at::Tensor> before = clones(fresh->parameters());
  StateDict target =
      state_of({{"model", as_ivalue(fresh.ptr())}, {"optim", as_ivalue(fresh_optimizer)}, {"step", int64_t(0)}});
  expect_invalid_naming([&] { load(target, dir.path()); }, {"'optim'", cause});
  expect_unchanged(before, fresh->parameters());
  EXPECT_EQ(target.at("step").toInt(), 0);
  EXPECT_TRUE(fresh_optimizer->state().empty());
}

TEST(DcpLoadValidation, AnOptimizerWithFewerGroupsFailsBeforeAnythingChanges) {
  expect_group_mismatch_changes_nothing({3, 3}, {6}, "the state has 2 param groups, the optimizer 1");
}

TEST(DcpLoadValidation, GroupsOfOtherSizesFailBeforeAnythingChanges) {
  expect_group_mismatch_changes_nothing({3, 3}, {2, 4}, "'params' must list 2 parameter ids");
}

// A Stateful whose check rejects what it is offered, and that counts its loads.
class Picky final : public Stateful {
 public:
  StateDict state_dict() override { return state_of({{"w", weight}, {"version", version}}); }
  void check_load_state_dict(const StateDict& state) override {
    if (state.at("version").toInt() != version) {
      throw InvalidArgument(fmt::format("Picky: version {} cannot be loaded", state.at("version").toInt()));
    }
  }
  void load_state_dict(const StateDict& state) override {
    check_load_state_dict(state);
    ++loads;
  }
  at::Tensor weight = torch::zeros({4});
  int64_t version = 1;
  int loads = 0;
};

TEST(DcpLoadValidation, AStatefulsCheckRunsBeforeAnyEntryIsFilled) {
  const ScratchDir dir;
  auto saved = c10::make_intrusive<Picky>();
  saved->weight = torch::ones({4});
  saved->version = 2;
  save(state_of({{"first", torch::ones({3})}, {"picky", as_ivalue(saved)}, {"also", torch::ones({3})}}), dir.path());

  auto picky = c10::make_intrusive<Picky>();
  StateDict target = state_of({{"first", torch::zeros({3})}, {"picky", as_ivalue(picky)}, {"also", torch::zeros({3})}});
  expect_invalid_naming([&] { load(target, dir.path()); }, {"'picky'", "version 2 cannot be loaded"});
  EXPECT_TRUE(torch::equal(target.at("first").toTensor(), torch::zeros({3})));
  EXPECT_TRUE(torch::equal(target.at("also").toTensor(), torch::zeros({3})));
  EXPECT_TRUE(torch::equal(picky->weight, torch::zeros({4})));
  EXPECT_EQ(picky->loads, 0);

  // What it accepts loads: the check saw the saved version.
  picky->version = 2;
  load(target, dir.path());
  EXPECT_EQ(picky->loads, 1);
  EXPECT_TRUE(torch::equal(picky->weight, torch::ones({4})));
}

// Saves {"a", "w"} of ones, then loads into {"a": zeros, "w": `destination`}.
void expect_destination_rejected(const at::Tensor& destination, const std::string& cause) {
  const ScratchDir dir;
  save(state_of({{"a", torch::ones({4, 5})}, {"w", torch::ones(destination.sizes(), destination.dtype())}}),
       dir.path());
  StateDict target = state_of({{"a", torch::zeros({4, 5})}, {"w", destination}});
  expect_invalid_naming([&] { load(target, dir.path()); }, {"entry 'w'", cause});
  EXPECT_TRUE(torch::equal(target.at("a").toTensor(), torch::zeros({4, 5})));
}

TEST(DcpLoadValidation, DestinationsThatCannotBeWrittenAreRejectedNamingTheEntry) {
  expect_destination_rejected(torch::zeros({1, 5}).expand({4, 5}), "overlap");
  expect_destination_rejected(torch::zeros({8}).as_strided({4, 5}, {1, 1}), "overlap");
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = torch::zeros({4, 5});
  }
  expect_destination_rejected(inference, "inference");
  expect_destination_rejected(torch::zeros({4, 5}, torch::Device(c10::kMeta)), "meta");
}

TEST(DcpLoadValidation, AStatefulsOrAShardsUnwritableTensorIsRejectedNamingTheEntry) {
  const ScratchDir dir;
  auto saved = c10::make_intrusive<Picky>();
  save(state_of({{"a", torch::ones({3})}, {"picky", as_ivalue(saved)}, {"s", torch::ones({4, 5})}}), dir.path());

  auto picky = c10::make_intrusive<Picky>();
  picky->weight = torch::zeros({1}).expand({4});
  StateDict target = state_of({{"a", torch::zeros({3})}, {"picky", as_ivalue(picky)}, {"s", torch::zeros({4, 5})}});
  expect_invalid_naming([&] { load(target, dir.path()); }, {"entry 'picky.w'", "overlap"});
  EXPECT_TRUE(torch::equal(target.at("a").toTensor(), torch::zeros({3})));

  StateDict sharded =
      state_of({{"a", torch::zeros({3})}, {"s", sharded_tensor(torch::zeros({1, 5}).expand({2, 5}), {4, 5}, {2, 0})}});
  expect_invalid_naming([&] { load(sharded, dir.path(), LoadOptions().allow_partial_load(true)); },
                        {"entry 's'", "overlap"});
  EXPECT_TRUE(torch::equal(sharded.at("a").toTensor(), torch::zeros({3})));
}

TEST(DcpLoadValidation, EmptyAndZeroStrideButEmptyDestinationsStillLoad) {
  // Nothing is written into an empty tensor, whatever its strides.
  const ScratchDir dir;
  save(state_of({{"e", torch::zeros({0, 5})}, {"a", torch::ones({2})}}), dir.path());
  StateDict target = state_of({{"e", torch::zeros({1, 5}).expand({0, 5})}, {"a", torch::zeros({2})}});
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(target.at("a").toTensor(), torch::ones({2})));
}

}  // namespace
}  // namespace stowage::dcp
