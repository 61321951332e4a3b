#include <stowage/error.h>
#include <stowage/state/copy.h>
#include <stowage/state/stateful.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

namespace stowage {
namespace {

using OptimizerFactory = std::function<std::shared_ptr<torch::optim::Optimizer>(torch::nn::Sequential&)>;

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::BatchNorm1d(16),
                               torch::nn::Linear(16, 1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, uint64_t seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    const auto x = torch::randn({32, 8});
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), x.sum(1, true).cos()).backward();
    optimizer.step();
  }
}

// Two param groups with different options, so that group options must round-trip.
std::vector<torch::optim::OptimizerParamGroup> groups(torch::nn::Sequential& model,
                                                      std::unique_ptr<torch::optim::OptimizerOptions> first,
                                                      std::unique_ptr<torch::optim::OptimizerOptions> second) {
  auto params = model->parameters();
  std::vector<torch::Tensor> a(params.begin(), params.begin() + 2);
  std::vector<torch::Tensor> b(params.begin() + 2, params.end());
  return {torch::optim::OptimizerParamGroup(a, std::move(first)),
          torch::optim::OptimizerParamGroup(b, std::move(second))};
}

void expect_exact_resume(const OptimizerFactory& make_optimizer) {
  torch::manual_seed(0);
  auto model = make_model();
  auto optimizer = make_optimizer(model);
  train(model, *optimizer, 5, 1);

  StateDict live;
  live.insert("model", ModuleState(model.ptr()).state_dict());
  live.insert("optim", OptimizerState(optimizer).state_dict());
  StateDict saved = create_cpu_state_dict(live);
  copy_state_dict(live, saved);

  train(model, *optimizer, 5, 2);  // the uninterrupted run

  torch::manual_seed(123);  // a different initialisation, overwritten by the load
  auto resumed = make_model();
  auto resumed_optimizer = make_optimizer(resumed);
  ModuleState(resumed.ptr()).load_state_dict(saved.at("model").toGenericDict());
  OptimizerState(resumed_optimizer).load_state_dict(saved.at("optim").toGenericDict());
  train(resumed, *resumed_optimizer, 5, 2);

  const auto expected = ModuleState(model.ptr()).state_dict();
  const auto actual = ModuleState(resumed.ptr()).state_dict();
  for (const auto& item : expected) {
    EXPECT_TRUE(torch::equal(item.value().toTensor(), actual.at(item.key()).toTensor())) << item.key();
  }
  const FlatStateDict expected_optim = flatten_state_dict(OptimizerState(optimizer).state_dict());
  const FlatStateDict actual_optim = flatten_state_dict(OptimizerState(resumed_optimizer).state_dict());
  ASSERT_EQ(expected_optim.size(), actual_optim.size());
  for (const FlatEntry& e : expected_optim.entries()) {
    const c10::IValue& other = actual_optim.at(e.fqn).value;
    if (e.value.isTensor()) {
      EXPECT_TRUE(torch::equal(e.value.toTensor(), other.toTensor())) << e.fqn;
    } else {
      EXPECT_EQ(e.value, other) << e.fqn;
    }
  }
}

TEST(OptimizerState, AdamAmsgradWithTwoGroupsResumesBitIdentically) {
  expect_exact_resume([](torch::nn::Sequential& m) {
    return std::make_shared<torch::optim::Adam>(
        groups(m, std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(1e-2).amsgrad(true)),
               std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(3e-3).weight_decay(0.1))),
        torch::optim::AdamOptions(1e-3));
  });
}

TEST(OptimizerState, AdamWWithTwoGroupsResumesBitIdentically) {
  expect_exact_resume([](torch::nn::Sequential& m) {
    return std::make_shared<torch::optim::AdamW>(
        groups(m, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2)),
               std::make_unique<torch::optim::AdamWOptions>(
                   torch::optim::AdamWOptions(2e-3).amsgrad(true).betas({0.8, 0.9}))),
        torch::optim::AdamWOptions(1e-3));
  });
}

TEST(OptimizerState, SgdWithMomentumResumesBitIdentically) {
  expect_exact_resume([](torch::nn::Sequential& m) {
    return std::make_shared<torch::optim::SGD>(
        groups(m, std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9)),
               std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.5).nesterov(true))),
        torch::optim::SGDOptions(0.1));
  });
}

TEST(OptimizerState, GroupOptionsAndStepAreSaved) {
  auto model = make_model();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.25));
  train(model, *optimizer, 3, 1);
  const FlatStateDict flat = flatten_state_dict(OptimizerState(optimizer).state_dict());
  EXPECT_EQ(flat.at("param_groups.0.lr").value.toDouble(), 0.25);
  EXPECT_EQ(flat.at("state.0.step").value.toInt(), 3);
  EXPECT_TRUE(flat.contains("state.0.exp_avg_sq"));
  EXPECT_FALSE(flat.contains("state.0.max_exp_avg_sq"));  // amsgrad off: never allocated
  EXPECT_EQ(flat.at("param_groups.0.params").value.toIntVector().size(), model->parameters().size());
}

TEST(OptimizerState, InvalidStateIsRejectedAndNothingChanges) {
  auto model = make_model();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.1));
  train(model, *optimizer, 2, 1);
  OptimizerState adapter(optimizer);
  StateDict good = create_cpu_state_dict(adapter.state_dict());
  copy_state_dict(adapter.state_dict(), good);
  const at::Tensor exp_avg_before =
      good.at("state").toGenericDict().at("0").toGenericDict().at("exp_avg").toTensor().clone();

  StateDict bad = deep_copy_structure(good);
  bad.at("state").toGenericDict().at("1").toGenericDict().insert_or_assign("exp_avg", torch::ones({3, 3}));
  bad.at("param_groups").toList().get(0).toGenericDict().insert_or_assign("lr", 99.0);
  try {
    adapter.load_state_dict(bad);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("state.1.exp_avg"), std::string::npos) << e.what();
  }
  EXPECT_EQ(optimizer->param_groups()[0].options().get_lr(), 0.1);
  const auto now = adapter.state_dict().at("state").toGenericDict().at("0").toGenericDict().at("exp_avg").toTensor();
  EXPECT_TRUE(torch::equal(now, exp_avg_before));

  StateDict wrong_groups = deep_copy_structure(good);
  wrong_groups.at("param_groups").toList().push_back(wrong_groups.at("param_groups").toList().get(0));
  EXPECT_THROW(adapter.load_state_dict(wrong_groups), InvalidArgument);

  StateDict unknown_key = deep_copy_structure(good);
  unknown_key.at("state").toGenericDict().at("0").toGenericDict().insert("momentum_buffer", torch::ones({1}));
  EXPECT_THROW(adapter.load_state_dict(unknown_key), InvalidArgument);
}

TEST(OptimizerState, UnsupportedOptimizerTypeIsNamed) {
  auto model = make_model();
  auto rmsprop = std::make_shared<torch::optim::RMSprop>(model->parameters(), torch::optim::RMSpropOptions(0.1));
  try {
    OptimizerState adapter(rmsprop);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RMSprop"), std::string::npos) << e.what();
  }
}

TEST(ModuleState, HoldsParametersAndBuffersByDottedName) {
  auto model = make_model();
  const StateDict sd = ModuleState(model.ptr()).state_dict();
  EXPECT_TRUE(sd.contains("0.weight"));
  EXPECT_TRUE(sd.contains("2.running_mean"));
  EXPECT_TRUE(sd.contains("2.num_batches_tracked"));
  // Aliases, not copies: loading in place reaches the module.
  EXPECT_EQ(sd.at("0.weight").toTensor().data_ptr(), model->parameters()[0].data_ptr());
}

TEST(ModuleState, StrictLoadRejectsMismatchesWithoutChangingTheModule) {
  auto model = make_model();
  ModuleState adapter(model.ptr());
  const at::Tensor before = model->parameters()[0].detach().clone();
  StateDict sd = create_cpu_state_dict(adapter.state_dict());
  copy_state_dict(adapter.state_dict(), sd);
  sd.at("0.weight").toTensor().fill_(5);

  StateDict missing = deep_copy_structure(sd);
  missing.erase("3.bias");
  EXPECT_THROW(adapter.load_state_dict(missing), InvalidArgument);
  StateDict unexpected = deep_copy_structure(sd);
  unexpected.insert("9.weight", torch::ones({1}));
  EXPECT_THROW(adapter.load_state_dict(unexpected), InvalidArgument);
  StateDict dtype = deep_copy_structure(sd);
  dtype.insert_or_assign("3.bias", torch::ones({1}, torch::kDouble));
  try {
    adapter.load_state_dict(dtype);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'3.bias'"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(model->parameters()[0], before));

  adapter.load_state_dict(sd);
  EXPECT_TRUE(torch::equal(model->parameters()[0], torch::full_like(before, 5)));
}

TEST(OptimizerState, CheckLoadStateDictRejectsWhatLoadWouldAndChangesNothing) {
  auto model = make_model();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.1));
  train(model, *optimizer, 2, 1);
  OptimizerState adapter(optimizer);
  StateDict good = create_cpu_state_dict(adapter.state_dict());
  copy_state_dict(adapter.state_dict(), good);
  adapter.check_load_state_dict(good);

  StateDict wrong_groups = deep_copy_structure(good);
  wrong_groups.at("param_groups").toList().push_back(wrong_groups.at("param_groups").toList().get(0));
  StateDict undefined = deep_copy_structure(good);
  undefined.at("state").toGenericDict().at("0").toGenericDict().insert_or_assign("exp_avg", at::Tensor());
  for (const StateDict& bad : {wrong_groups, undefined}) {
    EXPECT_THROW(adapter.check_load_state_dict(bad), InvalidArgument);
    EXPECT_THROW(adapter.load_state_dict(bad), InvalidArgument);  // not a c10::Error
  }
  EXPECT_EQ(optimizer->param_groups()[0].options().get_lr(), 0.1);
}

TEST(ModuleState, AParameterThatCannotBeWrittenInPlaceIsRejectedBeforeAnyIsWritten) {
  // An expanded parameter last: copy_ into it would throw after the others were filled.
  auto model = std::make_shared<torch::nn::Module>();
  const at::Tensor first = model->register_parameter("first", torch::zeros({3}));
  model->register_parameter("shared_row", torch::zeros({1, 4}).expand({2, 4}));
  ModuleState adapter(model);
  StateDict sd;
  sd.insert("first", torch::ones({3}));
  sd.insert("shared_row", torch::ones({2, 4}));
  for (const auto& call : std::vector<std::function<void()>>{[&] { adapter.check_load_state_dict(sd); },
                                                             [&] { adapter.load_state_dict(sd); }}) {
    try {
      call();
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'shared_row'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(torch::equal(first, torch::zeros({3})));
}

TEST(Stateful, TravelsInsideAStateDictAsACapsule) {
  auto model = make_model();
  StateDict sd;
  sd.insert("model", as_ivalue(model.ptr()));
  sd.insert("plain", torch::ones({1}));
  const auto object = as_stateful(sd.at("model"));
  ASSERT_TRUE(object);
  EXPECT_TRUE(object->state_dict().contains("0.weight"));
  EXPECT_FALSE(as_stateful(sd.at("plain")));
  // A Stateful is not a state dict value: flattening asks for its state_dict() first.
  EXPECT_THROW(flatten_state_dict(sd), InvalidArgument);
}

}  // namespace
}  // namespace stowage
