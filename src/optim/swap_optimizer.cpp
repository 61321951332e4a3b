#include <stowage/error.h>
#include <stowage/optim/partition.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/state/optimizer_adapter.h>

#include "optim/adam_update.h"
#include "optim/disk_tier.h"
#include "optim/host_update.h"
#include "optim/swap_internal.h"
#include "optim/swap_pipeline.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <c10/util/Type.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <type_traits>

namespace stowage::optim {

using detail::describe;
using detail::Family;
using detail::StateTensor;
using detail::Unit;
using memory::CopyEvent;
using memory::CopyLane;

namespace {

int64_t nbytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

bool amsgrad_of(Family family, const torch::optim::OptimizerOptions& options) {
  return family == Family::kAdam ? static_cast<const torch::optim::AdamOptions&>(options).amsgrad()
                                 : static_cast<const torch::optim::AdamWOptions&>(options).amsgrad();
}

}  // namespace

namespace detail {

// Two wrappers of one optimizer would each rebind its states to their own host layout
// and step them, and a checkpoint through the optimizer itself would bypass the wrapper's
// host layout, so an optimizer is claimed by one wrapper for that wrapper's lifetime
// (state/optimizer_adapter.h; stowage::OptimizerState then refuses it).
struct WrapClaim {
  explicit WrapClaim(const torch::optim::Optimizer& wrapped) : optimizer(&wrapped) {
    if (!claim_optimizer(wrapped, "SwapOptimizer")) {
      throw InvalidArgument(
          fmt::format("swap_optimizer: this {} is already wrapped by a live {}; wrap an optimizer once and use that "
                      "wrapper (it can be wrapped again once that wrapper is destroyed)",
                      c10::demangle(typeid(wrapped).name()), optimizer_claimant(wrapped)));
    }
  }
  ~WrapClaim() { release_optimizer_claim(*optimizer); }
  WrapClaim(const WrapClaim&) = delete;
  WrapClaim& operator=(const WrapClaim&) = delete;

  const torch::optim::Optimizer* optimizer;
};

}  // namespace detail

// ------------------------------------------------------------------ construction

SwapOptimizer::Rep::Rep(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config)
    : optimizer_(std::move(optimizer)),
      config_(std::move(config)),
      env_(config_.env() != nullptr ? config_.env() : SwapEnv::standard()),
      device_(c10::kCPU) {
  if (!optimizer_) {
    throw InvalidArgument("swap_optimizer: null optimizer");
  }
  // First, so that a second wrapper fails before it touches the states.
  claim_ = std::make_unique<detail::WrapClaim>(*optimizer_);
  const detail::SwapTarget target = detail::swap_target_of(*optimizer_);
  adapter_ = target.adapter;
  family_ = target.family;
  fused_on_host_ = target.fused_on_host;
  swapped_slot_.assign(detail::kSlotCount, false);
  for (const std::string& key : config_.swapped_keys()) {
    const int slot = detail::slot_of(key);
    if (slot < 0 || !detail::has_slot(*adapter_, slot)) {
      throw InvalidArgument(fmt::format("Requested state key '{}' is not available for {}.", key, adapter_->name()));
    }
    swapped_slot_[slot] = true;
  }
  // The host update needs every state of its parameters on the host, the master too.
  if (config_.update_on_host() && detail::has_slot(*adapter_, detail::kMasterParamSlot)) {
    swapped_slot_[detail::kMasterParamSlot] = true;
  }
  const auto& groups = optimizer_->param_groups();
  for (const auto& group : groups) {
    if (!group.params().empty()) {
      device_ = group.params().front().device();
      break;
    }
  }
  check_param_groups();
  if (config_.disk_tier()) {
    std::error_code error;
    if (!std::filesystem::is_directory(config_.swap_dir(), error)) {
      throw InvalidArgument(fmt::format("SwapOptimizerConfig.swap_dir '{}' is not a directory{}", config_.swap_dir(),
                                        error ? ": " + error.message() : std::string()));
    }
    disk_ = std::make_unique<detail::DiskTier>(config_.file_env(), config_.io_path(), config_.buffer_count());
    disk_->stats.io_path = disk_->io->path();
  }
  engine_ = std::make_unique<memory::CopyEngine>(device_, env_);
  if (config_.update_on_host()) {
    host_update_ = std::make_unique<detail::HostUpdate>(*engine_, config_.offload_gradients_in_backward());
    host_update_->watch(host_share());
  }
  layout_ = std::make_unique<detail::HostLayout>();

  // States created before wrapping go to the host now, so that they hold no device memory
  // during the forward and backward pass. Blocking here, once, means that when the wrapper
  // is returned that memory is free and the host copies are complete.
  std::vector<Unit> units = collect_units();
  ensure_host_layout(placements_for(units, {}));
  engine_->synchronize(host_ready_);
  record_steps();
}

SwapOptimizer::Rep::~Rep() = default;

// ------------------------------------------------------------------- the class

SwapOptimizer::SwapOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config)
    : rep_(std::make_unique<Rep>(std::move(optimizer), std::move(config))) {}

SwapOptimizer::~SwapOptimizer() = default;

at::Tensor SwapOptimizer::step(const torch::optim::Optimizer::LossClosure& closure) {
  return rep_->step(closure);
}

void SwapOptimizer::zero_grad() {
  rep_->optimizer_->zero_grad();
  if (rep_->host_update_) rep_->host_update_->discard_gradients();
}

torch::optim::Optimizer& SwapOptimizer::optimizer() {
  return *rep_->optimizer_;
}

std::vector<torch::optim::OptimizerParamGroup>& SwapOptimizer::param_groups() {
  return rep_->optimizer_->param_groups();
}

const SwapOptimizerConfig& SwapOptimizer::config() const {
  return rep_->config_;
}

memory::CopyStats SwapOptimizer::copy_stats() const {
  return rep_->engine_->stats();
}

memory::CopyEngine& SwapOptimizer::copy_engine() {
  return *rep_->engine_;
}

DiskTierStats SwapOptimizer::disk_stats() const {
  return rep_->disk_stats();
}

int64_t SwapOptimizer::resident_state_bytes() const {
  return rep_->resident_state_bytes();
}

StateDict SwapOptimizer::state_dict() {
  return rep_->state_dict();
}

void SwapOptimizer::load_state_dict(const StateDict& state) {
  rep_->load_state_dict(state);
}

void SwapOptimizer::check_load_state_dict(const StateDict& state) {
  rep_->check_load_state_dict(state);
}

c10::intrusive_ptr<SwapOptimizer> swap_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                                 SwapOptimizerConfig config) {
  return c10::make_intrusive<SwapOptimizer>(std::move(optimizer), std::move(config));
}

int64_t min_disk_host_budget(const std::vector<at::Tensor>& params, const SwapOptimizerConfig& config, bool amsgrad) {
  int64_t largest = 0;
  for (const at::Tensor& param : params) {
    if (!at::isFloatingType(param.scalar_type()) || param.numel() < config.min_numel()) continue;
    const int64_t state = detail::align_up(static_cast<int64_t>(param.nbytes()), detail::kDiskAlignmentBytes);
    largest = std::max(largest, state * (amsgrad ? 3 : 2));
  }
  return largest * config.buffer_count();
}

bool is_swap_optimizer(const c10::IValue& value) {
  const c10::intrusive_ptr<Stateful> stateful = as_stateful(value);
  return stateful && dynamic_cast<SwapOptimizer*>(stateful.get()) != nullptr;
}

// -------------------------------------------------------------------- checks

void SwapOptimizer::Rep::check_param_groups() const {
  const auto& groups = optimizer_->param_groups();
  // One copy engine serves one device, and the state of a parameter listed twice would be
  // updated twice per step.
  std::map<const c10::TensorImpl*, std::pair<size_t, size_t>> seen;  // group and index
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      if (params[p].device() != device_) {
        throw InvalidArgument(fmt::format(
            "swap_optimizer: parameter {} of param group {} is on {}, but the other parameters are on {}; the "
            "swap serves one device",
            p, g, params[p].device().str(), device_.str()));
      }
      const auto [first, inserted] = seen.emplace(params[p].unsafeGetTensorImpl(), std::make_pair(g, p));
      if (!inserted) {
        throw InvalidArgument(fmt::format(
            "swap_optimizer: parameter {} of param group {} is also parameter {} of param group {}; a parameter "
            "listed twice would be updated twice per step",
            p, g, first->second.second, first->second.first));
      }
    }
  }
  const auto& explicit_keys = config_.state_keys();
  if (std::find(explicit_keys.begin(), explicit_keys.end(), kMaxExpAvgSq) != explicit_keys.end() &&
      std::none_of(groups.begin(), groups.end(), [&](const auto& g) { return amsgrad_of(family_, g.options()); })) {
    throw InvalidArgument(fmt::format(
        "Requested state key 'max_exp_avg_sq' is not present for any parameter: no param group of the {} has "
        "amsgrad enabled.",
        adapter_->name()));
  }
}

// LibTorch's step() cannot be intercepted, but it moves the step count of every parameter
// it updates (and creates the states of those without, at step 1): a count other than the
// one this wrapper left is its trace. Between wrapper calls nothing else changes a count.
void SwapOptimizer::Rep::check_steps_are_the_wrappers() const {
  auto& states = optimizer_->state();
  const auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      torch::optim::OptimizerParamState* state = detail::find_state(states, params[p]);
      if (state == nullptr) continue;
      const int64_t step = *detail::param_state(*adapter_, *state).step;
      const auto recorded = recorded_steps_.find(params[p].unsafeGetTensorImpl());
      const int64_t left = recorded == recorded_steps_.end() ? 0 : recorded->second;
      if (step == left) continue;
      throw InvalidArgument(fmt::format(
          "Swap optimizer: parameter {} of param group {} is at step {}, but the SwapOptimizer left it at step {}: "
          "{}; drive steps and restores through the SwapOptimizer only",
          p, g, step, left,
          step > left ? "the wrapped optimizer's own step() ran after wrapping, or a state was loaded into it "
                        "rather than into the SwapOptimizer"
                      : "a state was loaded into the wrapped optimizer rather than into the SwapOptimizer, or its "
                        "state was changed otherwise"));
    }
  }
}

void SwapOptimizer::Rep::record_steps() {
  auto& states = optimizer_->state();
  recorded_steps_.clear();
  for (const auto& group : optimizer_->param_groups()) {
    for (const at::Tensor& param : group.params()) {
      if (torch::optim::OptimizerParamState* state = detail::find_state(states, param)) {
        recorded_steps_[param.unsafeGetTensorImpl()] = *detail::param_state(*adapter_, *state).step;
      }
    }
  }
}

// ------------------------------------------------------------------------ step

void SwapOptimizer::Rep::check_gradients() const {
  auto& groups = optimizer_->param_groups();
  auto& states = optimizer_->state();
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool amsgrad = amsgrad_of(family_, groups[g].options());
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      const at::Tensor& param = params[p];
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer only supports dense Adam/AdamW gradients; parameter {} of param group {} has a sparse "
            "gradient.",
            p, g));
      }
      if (grad.scalar_type() != param.scalar_type() || grad.sizes() != param.sizes() ||
          grad.device() != param.device()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer: the gradient of parameter {} of param group {} is {} on {}, but the parameter is {} on "
            "{}.",
            p, g, describe(grad), grad.device().str(), describe(param), param.device().str()));
      }
      torch::optim::OptimizerParamState* state = detail::find_state(states, param);
      if (amsgrad && state != nullptr &&
          !detail::param_state(*adapter_, *state).holder(detail::kMaxExpAvgSqSlot)->defined()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer: param group {} has amsgrad on but parameter {} has no max_exp_avg_sq state (amsgrad was "
            "enabled after its state was created).",
            g, p));
      }
    }
  }
}

void SwapOptimizer::Rep::create_first_step_states() {
  auto& groups = optimizer_->param_groups();
  auto& states = optimizer_->state();
  std::vector<std::pair<const void*, int>> pending;  // the new states to be swapped, not yet allocated
  std::vector<typename std::decay_t<decltype(states)>::key_type> created;
  for (auto& group : groups) {
    const bool amsgrad = amsgrad_of(family_, group.options());
    for (const at::Tensor& param : group.params()) {
      if (!has_gradient(param) || detail::find_state(states, param) != nullptr) continue;
      auto state = adapter_->new_state();
      const c10::ScalarType dtype = adapter_->state_dtype(param);
      for (const StateTensor& tensor : detail::param_state(*adapter_, *state).tensors) {
        if (tensor.slot == detail::kMaxExpAvgSqSlot && !amsgrad) continue;
        if (swapped_slot_[tensor.slot] && at::isFloatingType(dtype) && param.numel() >= config_.min_numel()) {
          pending.emplace_back(param.unsafeGetTensorImpl(), tensor.slot);
        } else if (tensor.slot == detail::kMasterParamSlot) {
          *tensor.holder = param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
        } else {
          *tensor.holder = at::zeros_like(param, param.options().dtype(dtype), at::MemoryFormat::Preserve);
        }
      }
      created.push_back(detail::state_key(states, param));
      states[created.back()] = std::move(state);
      // At step 0, as a parameter without state; drops any record of a freed parameter
      // that had this address.
      recorded_steps_.erase(param.unsafeGetTensorImpl());
    }
  }
  try {
    std::vector<Unit> units = collect_units();
    ensure_host_layout(placements_for(units, pending));
  } catch (...) {
    for (const auto& key : created) states.erase(key);
    throw;
  }
}

at::Tensor SwapOptimizer::Rep::step(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure != nullptr) {
    throw InvalidArgument(
        "Swap optimizer does not support a closure: run the forward and backward pass, then call step().");
  }
  torch::NoGradGuard no_grad;
  // Everything that can be checked is checked before anything changes, so that no update
  // can fail on its inputs once the first one has run. The param groups are the wrapped
  // optimizer's, which may have changed since the constructor checked them.
  check_steps_are_the_wrappers();
  check_param_groups();
  check_gradients();
  create_first_step_states();

  // Packed mode moves contiguous host ranges, so it carries the states of parameters
  // without a gradient along (unchanged); per-tensor mode leaves them on the host.
  std::vector<Unit> units = collect_units();
  std::vector<at::Tensor> share;
  if (host_update_) {
    share = host_share();
    std::vector<Unit> on_host = detail::take_host_units(units, share);
    for (const Unit& unit : units) host_update_->restore_gradient(unit.param);
    host_update_->run(on_host, [this](Unit& unit, const at::Tensor& param, const at::Tensor& grad) {
      update_unit(
          unit, [](const StateTensor& tensor) { return *tensor.holder; }, param, grad, /*on_host=*/true);
    });
  }
  if (!config_.packed_swap()) {
    units.erase(std::remove_if(units.begin(), units.end(), [](const Unit& u) { return !u.has_grad; }), units.end());
  }
  // A batch's cost is what it takes of a staging arena or, on the disk tier, of a host
  // buffer, where every state starts at an aligned offset.
  std::vector<int64_t> costs;
  for (const Unit& unit : units) {
    int64_t bytes = 0;
    for (const StateTensor& tensor : unit.state.tensors) {
      if (tensor.swapped)
        bytes += disk_ ? detail::align_up(nbytes(*tensor.holder), detail::kDiskAlignmentBytes) : nbytes(*tensor.holder);
    }
    costs.push_back(std::max<int64_t>(1, bytes));
  }
  const detail::Batches batches(disk_ ? disk_batches(units, costs) : partition_by_cost(costs, config_.swap_times()));
  std::unique_ptr<detail::SwapTransport> transport;
  if (disk_) {
    transport =
        detail::make_disk_transport(*engine_, units, batches, layout_->files, *disk_, device_, config_.packed_swap());
  } else if (config_.packed_swap()) {
    transport = detail::make_packed_transport(*engine_, units, batches, layout_->buffers, device_);
  } else {
    transport = detail::make_per_tensor_transport(*engine_, units, batches, device_);
  }
  detail::run_swap_pipeline(*engine_, *transport, units, batches, host_ready_,
                            [this](Unit& unit, const auto& swapped_state) {
                              update_unit(unit, swapped_state, unit.param, unit.param.grad(), /*on_host=*/false);
                            });
  // The share as the param groups now have it, for the next backward.
  if (host_update_) host_update_->watch(share);
  return {};
}

bool SwapOptimizer::Rep::has_gradient(const at::Tensor& param) const {
  return host_update_ ? host_update_->has_gradient(param) : param.grad().defined();
}

std::vector<at::Tensor> SwapOptimizer::Rep::host_share() const {
  return detail::host_share(optimizer_->param_groups(), config_.offload_fraction(), config_.min_numel());
}

std::vector<int64_t> SwapOptimizer::Rep::disk_batches(const std::vector<Unit>& units,
                                                      const std::vector<int64_t>& costs) {
  if (units.empty()) return {};
  const int64_t budget = config_.host_budget_bytes();
  const int64_t buffer_bytes =
      budget / config_.buffer_count() / detail::kDiskAlignmentBytes * detail::kDiskAlignmentBytes;
  int64_t parts = config_.swap_times();
  if (budget > 0) {
    int64_t total = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      if (costs[u] > buffer_bytes) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer disk tier: the swapped states of parameter {} (param group {}) take {} bytes, more than "
            "one host buffer holds: host_budget_bytes {} / buffer_count {} gives {} bytes; raise the budget or lower "
            "buffer_count",
            units[u].index, units[u].group, costs[u], budget, config_.buffer_count(), buffer_bytes));
      }
      total += costs[u];
    }
    parts = std::max(parts, (total + buffer_bytes - 1) / buffer_bytes);
  }
  // More batches until each fits a buffer: at worst one parameter each, which fits.
  for (;;) {
    std::vector<int64_t> sizes = partition_by_cost(costs, parts);
    int64_t largest = 0;
    size_t u = 0;
    for (const int64_t size : sizes) {
      int64_t cost = 0;
      for (const size_t end = u + size; u < end; ++u) cost += costs[u];
      largest = std::max(largest, cost);
    }
    if (budget == 0 || largest <= buffer_bytes) {
      disk_->ensure_buffers(budget == 0 ? largest : buffer_bytes, device_);
      return sizes;
    }
    parts += std::max<int64_t>(1, parts / 8);
  }
}

DiskTierStats SwapOptimizer::Rep::disk_stats() const {
  if (!disk_) throw Error("SwapOptimizer::disk_stats: this optimizer keeps its states in host memory (no swap_dir)");
  return disk_->stats;
}

// Updates one parameter, or (on an exception) changes nothing: the update allocates
// before it writes, and step() has checked its inputs. The step count moves only once the
// update is done.
void SwapOptimizer::Rep::update_unit(Unit& unit, const std::function<at::Tensor(const StateTensor&)>& swapped_state,
                                     const at::Tensor& param, const at::Tensor& grad, bool on_host) {
  if (!unit.has_grad) return;
  std::vector<at::Tensor> tensors(detail::kSlotCount);
  for (const StateTensor& tensor : unit.state.tensors) {
    tensors[tensor.slot] = tensor.swapped ? swapped_state(tensor) : *tensor.holder;
  }
  const auto& options = optimizer_->param_groups()[unit.group].options();
  const detail::AdamHyperParams hyper =
      detail::adam_hyper_params(options, family_ != Family::kAdam, fused_on_host_ || on_host);
  env_->before_update(unit.index);
  // The record moves with the count, so that after a failed step it still matches every
  // parameter, updated or not; its entry is made before the update writes.
  int64_t& recorded_step = recorded_steps_[unit.param.unsafeGetTensorImpl()];
  const int64_t step = *unit.state.step + 1;
  if (family_ == Family::kMasterAdamW) {
    detail::master_adamw_update(param, grad, tensors[detail::kMasterParamSlot], tensors[detail::kExpAvgSlot],
                                tensors[detail::kExpAvgSqSlot], tensors[detail::kMaxExpAvgSqSlot], step, hyper);
  } else {
    detail::adam_update(param, grad, tensors[detail::kExpAvgSlot], tensors[detail::kExpAvgSqSlot],
                        tensors[detail::kMaxExpAvgSqSlot], step, hyper);
  }
  *unit.state.step = step;
  recorded_step = step;
}

}  // namespace stowage::optim
