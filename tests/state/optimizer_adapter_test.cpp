// The optimizer adapter registry: a user's own optimizer type, once registered, saves and
// resumes through OptimizerState like LibTorch's; the adapter registered last wins.

#include <stowage/error.h>
#include <stowage/state/copy.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>
#include <stowage/state/stateful.h>

#include <gmock/gmock.h>
#include <torch/torch.h>

namespace stowage {
namespace {

// A user's optimizer: sign descent with momentum, p -= lr * sign(m), m = beta * m + g.
struct SignDescentOptions : public torch::optim::OptimizerCloneableOptions<SignDescentOptions> {
  explicit SignDescentOptions(double lr = 0.01) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, beta) = 0.9;
};

struct SignDescentParamState : public torch::optim::OptimizerCloneableParamState<SignDescentParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, momentum);
};

class SignDescent : public torch::optim::Optimizer {
 public:
  SignDescent(std::vector<at::Tensor> params, SignDescentOptions defaults)
      : Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                  std::make_unique<SignDescentOptions>(std::move(defaults))) {}

  at::Tensor step(LossClosure = nullptr) override {
    torch::NoGradGuard no_grad;
    for (auto& group : param_groups_) {
      const auto& options = static_cast<const SignDescentOptions&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) continue;
        auto key = key_of(param);
        if (state_.find(key) == state_.end()) {
          auto fresh = std::make_unique<SignDescentParamState>();
          fresh->momentum(torch::zeros_like(param));
          state_[key] = std::move(fresh);
        }
        auto& state = static_cast<SignDescentParamState&>(*state_[key]);
        state.momentum().mul_(options.beta()).add_(param.grad());
        param.sub_(state.momentum().sign(), options.lr());
        state.step(state.step() + 1);
      }
    }
    return {};
  }

  // The optimizer's own key for a parameter (a string in LibTorch 1.13, a pointer in 2.x).
  template <typename Key = typename decltype(state_)::key_type>
  static Key key_of(const at::Tensor& param) {
    if constexpr (std::is_same_v<Key, std::string>) {
      std::ostringstream out;
      out << param.unsafeGetTensorImpl();
      return out.str();
    } else {
      return static_cast<Key>(param.unsafeGetTensorImpl());
    }
  }
};

class SignDescentAdapter final : public OptimizerAdapter {
 public:
  std::string name() const override { return "SignDescent"; }
  bool handles(const torch::optim::Optimizer& optimizer) const override {
    return dynamic_cast<const SignDescent*>(&optimizer) != nullptr;
  }
  const std::vector<std::string>& tensor_keys() const override {
    static const std::vector<std::string> keys{"momentum"};
    return keys;
  }
  void write_options(const torch::optim::OptimizerOptions& base, c10::impl::GenericDict& group) const override {
    const auto& options = static_cast<const SignDescentOptions&>(base);
    group.insert("lr", options.lr());
    group.insert("beta", options.beta());
  }
  ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const override {
    const double lr = require_number(group, "lr", where);
    const double beta = require_number(group, "beta", where);
    return [=](torch::optim::OptimizerOptions& base) { static_cast<SignDescentOptions&>(base).lr(lr).beta(beta); };
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_state() const override {
    return std::make_unique<SignDescentParamState>();
  }
  bool has_step() const override { return true; }
  ParamStateFields fields(torch::optim::OptimizerParamState& base) const override {
    auto& state = static_cast<SignDescentParamState&>(base);
    return {&state.step(), {&state.momentum()}};
  }
};

// The registry is the process's: register once, for every test here.
void register_sign_descent() {
  static const bool registered = [] {
    register_optimizer_adapter(std::make_shared<SignDescentAdapter>());
    return true;
  }();
  EXPECT_TRUE(registered);
}

std::vector<at::Tensor> sign_descent_params() {
  torch::manual_seed(3);
  return {torch::randn({5, 4}).requires_grad_(), torch::randn({6}).requires_grad_()};
}

void sign_descent_steps(torch::optim::Optimizer& optimizer, std::vector<at::Tensor>& params, int from, int to) {
  for (int step = from; step < to; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      torch::manual_seed(100 * step + i);
      params[i].mutable_grad() = torch::randn(params[i].sizes());
    }
    optimizer.step();
  }
}

std::vector<at::Tensor> cloned_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  out.reserve(params.size());
  for (const at::Tensor& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

TEST(OptimizerAdapterRegistry, AnUnregisteredTypeIsRefusedNamingItAndTheRegisteredOnes) {
  auto model = torch::nn::Linear(3, 2);
  auto adagrad = std::make_shared<torch::optim::Adagrad>(model->parameters(), torch::optim::AdagradOptions(0.1));
  EXPECT_EQ(find_optimizer_adapter(*adagrad), nullptr);
  try {
    OptimizerState state(adagrad);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("OptimizerState"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("Adagrad"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("torch::optim::Adam, torch::optim::AdamW, torch::optim::SGD"));
  }
  EXPECT_THROW(register_optimizer_adapter(nullptr), InvalidArgument);
}

// A wrapper that keeps the optimizer's state (optim::SwapOptimizer) claims it: OptimizerState
// refuses it for as long as the claim lives, naming the wrapper to pass instead.
TEST(OptimizerAdapterRegistry, AClaimedOptimizerIsRefusedNamingItsWrapper) {
  auto model = torch::nn::Linear(3, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(optimizer_claimant(*sgd), "");
  ASSERT_TRUE(claim_optimizer(*sgd, "StateKeeper"));
  EXPECT_FALSE(claim_optimizer(*sgd, "OtherKeeper"));
  EXPECT_EQ(optimizer_claimant(*sgd), "StateKeeper");
  try {
    OptimizerState state(sgd);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("OptimizerState: this torch::optim::SGD is wrapped by a live "
                                               "StateKeeper, which keeps its state; pass the StateKeeper to save "
                                               "and restore, not the optimizer it wraps"));
  }
  release_optimizer_claim(*sgd);
  EXPECT_EQ(optimizer_claimant(*sgd), "");
  EXPECT_NO_THROW(OptimizerState(sgd).state_dict());
}

TEST(OptimizerAdapterRegistry, ARegisteredUserOptimizerResumesBitForBit) {
  register_sign_descent();
  auto params = sign_descent_params();
  auto optimizer = std::make_shared<SignDescent>(params, SignDescentOptions(0.05));
  sign_descent_steps(*optimizer, params, 0, 3);
  const StateDict live = OptimizerState(optimizer).state_dict();
  const FlatStateDict flat = flatten_state_dict(live);
  EXPECT_EQ(flat.at("state.1.step").value.toInt(), 3);
  EXPECT_EQ(flat.at("param_groups.0.beta").value.toDouble(), 0.9);
  EXPECT_TRUE(flat.contains("state.0.momentum"));
  StateDict saved = create_cpu_state_dict(live);
  copy_state_dict(live, saved);
  auto resumed_params = cloned_params(params);
  sign_descent_steps(*optimizer, params, 3, 6);  // the uninterrupted run

  auto resumed = std::make_shared<SignDescent>(resumed_params, SignDescentOptions(1.0));
  OptimizerState(resumed).load_state_dict(saved);
  EXPECT_EQ(static_cast<const SignDescentOptions&>(resumed->param_groups()[0].options()).lr(), 0.05);
  sign_descent_steps(*resumed, resumed_params, 3, 6);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], resumed_params[i])) << i;
}

TEST(OptimizerAdapterRegistry, ABadEntryOfAUserOptimizerIsRefusedByItsAdapterName) {
  register_sign_descent();
  auto params = sign_descent_params();
  auto optimizer = std::make_shared<SignDescent>(params, SignDescentOptions());
  sign_descent_steps(*optimizer, params, 0, 1);
  StateDict bad = deep_copy_structure(OptimizerState(optimizer).state_dict());
  bad.at("state").toGenericDict().at("0").toGenericDict().insert("exp_avg", torch::zeros({5, 4}));
  try {
    OptimizerState(optimizer).load_state_dict(bad);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("state.0: unexpected entry 'exp_avg' for SignDescent"));
  }
}

// An Adam whose state is saved by an adapter of its own.
class TracedAdam : public torch::optim::Adam {
 public:
  using Adam::Adam;
};

class TracedAdamAdapter final : public OptimizerAdapter {
 public:
  std::string name() const override { return "TracedAdam"; }
  bool handles(const torch::optim::Optimizer& optimizer) const override {
    return dynamic_cast<const TracedAdam*>(&optimizer) != nullptr;
  }
  const std::vector<std::string>& tensor_keys() const override { return adam_adapter().tensor_keys(); }
  void write_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& group) const override {
    adam_adapter().write_options(options, group);
  }
  ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const override {
    return adam_adapter().read_options(group, where);
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_state() const override { return adam_adapter().new_state(); }
  bool has_step() const override { return true; }
  ParamStateFields fields(torch::optim::OptimizerParamState& state) const override {
    return adam_adapter().fields(state);
  }
};

TEST(OptimizerAdapterRegistry, TheAdapterRegisteredLastServesASubclass) {
  auto model = torch::nn::Linear(3, 2);
  torch::optim::Adam adam(model->parameters());
  TracedAdam traced(model->parameters());
  static const std::shared_ptr<const OptimizerAdapter> traced_adapter = [&] {
    EXPECT_EQ(find_optimizer_adapter(traced), &adam_adapter());  // served as its base until then
    auto made = std::make_shared<TracedAdamAdapter>();
    register_optimizer_adapter(made);
    return made;
  }();
  EXPECT_EQ(find_optimizer_adapter(traced), traced_adapter.get());
  EXPECT_EQ(find_optimizer_adapter(adam), &adam_adapter());
}

}  // namespace
}  // namespace stowage
