#include <stowage/error.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <mutex>
#include <unordered_map>

namespace stowage {
namespace {

// torch::optim::Adam and AdamW: the same options and state fields, in distinct types.
template <typename OptimizerType, typename Options, typename State>
class AdamLikeAdapter final : public OptimizerAdapter {
 public:
  explicit AdamLikeAdapter(const char* name) : name_(name) {}

  std::string name() const override { return name_; }
  bool handles(const torch::optim::Optimizer& optimizer) const override {
    return dynamic_cast<const OptimizerType*>(&optimizer) != nullptr;
  }
  const std::vector<std::string>& tensor_keys() const override {
    static const std::vector<std::string> keys{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return keys;
  }
  void write_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& group) const override {
    write_adam_options(adam_option_values(static_cast<const Options&>(options)), group);
  }
  ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const override {
    const AdamOptionValues values = read_adam_options(group, where);
    return [values](torch::optim::OptimizerOptions& options) {
      apply_adam_options(values, static_cast<Options&>(options));
    };
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_state() const override { return std::make_unique<State>(); }
  bool has_step() const override { return true; }
  ParamStateFields fields(torch::optim::OptimizerParamState& base) const override {
    auto& state = static_cast<State&>(base);
    return {&state.step(), {&state.exp_avg(), &state.exp_avg_sq(), &state.max_exp_avg_sq()}};
  }

 private:
  const char* name_;
};

class SgdAdapter final : public OptimizerAdapter {
 public:
  std::string name() const override { return "torch::optim::SGD"; }
  bool handles(const torch::optim::Optimizer& optimizer) const override {
    return dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr;
  }
  const std::vector<std::string>& tensor_keys() const override {
    static const std::vector<std::string> keys{"momentum_buffer"};
    return keys;
  }
  void write_options(const torch::optim::OptimizerOptions& base, c10::impl::GenericDict& group) const override {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(base);
    group.insert("lr", options.lr());
    group.insert("momentum", options.momentum());
    group.insert("dampening", options.dampening());
    group.insert("weight_decay", options.weight_decay());
    group.insert("nesterov", options.nesterov());
  }
  ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const override {
    const double lr = require_number(group, "lr", where);
    const double momentum = require_number(group, "momentum", where);
    const double dampening = require_number(group, "dampening", where);
    const double weight_decay = require_number(group, "weight_decay", where);
    const bool nesterov = require_bool(group, "nesterov", where);
    return [=](torch::optim::OptimizerOptions& base) {
      static_cast<torch::optim::SGDOptions&>(base)
          .lr(lr)
          .momentum(momentum)
          .dampening(dampening)
          .weight_decay(weight_decay)
          .nesterov(nesterov);
    };
  }
  std::unique_ptr<torch::optim::OptimizerParamState> new_state() const override {
    return std::make_unique<torch::optim::SGDParamState>();
  }
  bool has_step() const override { return false; }
  ParamStateFields fields(torch::optim::OptimizerParamState& base) const override {
    return {nullptr, {&static_cast<torch::optim::SGDParamState&>(base).momentum_buffer()}};
  }
};

using AdamAdapter = AdamLikeAdapter<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>;
using AdamWAdapter = AdamLikeAdapter<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>;

// Invariant: the built-in adapters come first, so that a later registration overrides them.
class Registry {
 public:
  static Registry& instance() {
    static Registry registry;
    return registry;
  }

  void add(std::shared_ptr<const OptimizerAdapter> adapter) {
    std::lock_guard<std::mutex> lock(mutex_);
    adapters_.push_back(std::move(adapter));
  }

  const OptimizerAdapter* find(const torch::optim::Optimizer& optimizer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = adapters_.rbegin(); it != adapters_.rend(); ++it) {
      if ((*it)->handles(optimizer)) return it->get();
    }
    return nullptr;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> names;
    for (const auto& adapter : adapters_) names.push_back(adapter->name());
    return names;
  }

  const std::shared_ptr<const OptimizerAdapter> adam = std::make_shared<AdamAdapter>("torch::optim::Adam");
  const std::shared_ptr<const OptimizerAdapter> adamw = std::make_shared<AdamWAdapter>("torch::optim::AdamW");
  const std::shared_ptr<const OptimizerAdapter> sgd = std::make_shared<SgdAdapter>();

 private:
  Registry() : adapters_{adam, adamw, sgd} {}

  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<const OptimizerAdapter>> adapters_;  // adapters are never removed
};

// The optimizers a wrapper claims, with the wrapper's name. Leaked: a wrapper may end its
// claim during static destruction.
class Claims {
 public:
  static Claims& instance() {
    static Claims* const claims = new Claims();
    return *claims;
  }

  bool add(const torch::optim::Optimizer& optimizer, const std::string& wrapper) {
    std::lock_guard<std::mutex> lock(mutex_);
    return wrappers_.emplace(&optimizer, wrapper).second;
  }
  void remove(const torch::optim::Optimizer& optimizer) {
    std::lock_guard<std::mutex> lock(mutex_);
    wrappers_.erase(&optimizer);
  }
  std::string wrapper_of(const torch::optim::Optimizer& optimizer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = wrappers_.find(&optimizer);
    return it == wrappers_.end() ? std::string() : it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const torch::optim::Optimizer*, std::string> wrappers_;
};

}  // namespace

void register_optimizer_adapter(std::shared_ptr<const OptimizerAdapter> adapter) {
  if (!adapter) {
    throw InvalidArgument("register_optimizer_adapter: null adapter");
  }
  Registry::instance().add(std::move(adapter));
}

const OptimizerAdapter* find_optimizer_adapter(const torch::optim::Optimizer& optimizer) {
  return Registry::instance().find(optimizer);
}

const OptimizerAdapter& optimizer_adapter(const torch::optim::Optimizer& optimizer, const std::string& user) {
  const OptimizerAdapter* adapter = find_optimizer_adapter(optimizer);
  if (adapter == nullptr) {
    throw InvalidArgument(
        fmt::format("{} supports the optimizer types registered with register_optimizer_adapter ({}); "
                    "got {}",
                    user, fmt::join(Registry::instance().names(), ", "), c10::demangle(typeid(optimizer).name())));
  }
  const std::string wrapper = optimizer_claimant(optimizer);
  if (!wrapper.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: this {} is wrapped by a live {}, which keeps its state; pass the {} to save and restore, not the "
        "optimizer it wraps",
        user, adapter->name(), wrapper, wrapper));
  }
  return *adapter;
}

bool claim_optimizer(const torch::optim::Optimizer& optimizer, const std::string& wrapper) {
  return Claims::instance().add(optimizer, wrapper);
}

void release_optimizer_claim(const torch::optim::Optimizer& optimizer) {
  Claims::instance().remove(optimizer);
}

std::string optimizer_claimant(const torch::optim::Optimizer& optimizer) {
  return Claims::instance().wrapper_of(optimizer);
}

const OptimizerAdapter& adam_adapter() {
  return *Registry::instance().adam;
}

const OptimizerAdapter& adamw_adapter() {
  return *Registry::instance().adamw;
}

const OptimizerAdapter& sgd_adapter() {
  return *Registry::instance().sgd;
}

}  // namespace stowage
