#pragma once

// Types shared by the swap optimizer's translation units.

#include <stowage/dcp/env.h>
#include <stowage/optim/swap_env.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/state/optimizer_layout.h>

#include "optim/host_layout.h"
#include "optim/param_state.h"

#include <ATen/core/Tensor.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace stowage::optim::detail {

// Host buffer offsets (and the staging arenas' dtype ranges) are multiples of this many
// bytes, so that every state's host and device views start aligned.
inline constexpr int64_t kAlignmentBytes = 512;

inline int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// "Float [3, 4]", for error messages.
inline std::string describe(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

// A parameter that has optimizer state, with everything step() needs about it.
struct Unit {
  int64_t index = 0;  // the parameter's number across groups (its checkpoint id)
  size_t group = 0;
  at::Tensor param;
  bool has_grad = false;
  ParamState state;  // its tensors' `swapped` set against the host layout
};

struct DiskTier;
struct WrapClaim;
class HostUpdate;

}  // namespace stowage::optim::detail

namespace stowage::optim {

// A SwapOptimizer's fields and the helpers of its methods, which forward here.
struct SwapOptimizer::Rep {
  // Validates the config against the optimizer (throws stowage::InvalidArgument), then
  // moves any states that exist already to host buffers.
  Rep(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config);
  ~Rep();

  at::Tensor step(const torch::optim::Optimizer::LossClosure& closure);
  DiskTierStats disk_stats() const;
  int64_t resident_state_bytes();
  StateDict state_dict();
  void load_state_dict(const StateDict& state);
  void check_load_state_dict(const StateDict& state);
  // The state object that `item` loads for `param`, with the tensors that stay unswapped
  // set; appends where its swapped ones come from to `placements`.
  std::unique_ptr<torch::optim::OptimizerParamState> loaded_state(
      const OptimizerLayout::Entry& item, const at::Tensor& param,
      std::vector<detail::StatePlacement>& placements) const;

  // Throws InvalidArgument if the wrapped optimizer's param groups hold a parameter twice
  // or one on another device than device_, or if max_exp_avg_sq is to be swapped while
  // no group has amsgrad on. Run by the constructor and, as the groups may have changed
  // since (add_param_group, edited params or options), by every step().
  void check_param_groups() const;
  // Throws InvalidArgument for a gradient the update cannot take (sparse, or unlike its
  // parameter) and for a group with amsgrad on whose parameters' states lack
  // max_exp_avg_sq.
  void check_gradients() const;
  // Throws InvalidArgument naming the first parameter whose step count is not the one this
  // wrapper left (the wrapped optimizer's own step() ran), before anything changes.
  void check_steps_are_the_wrappers() const;
  // Each parameter's step count, as the wrapper leaves it after construction or a load.
  void record_steps();
  // The states of the parameters that have a gradient but no state yet, as the wrapped
  // optimizer would create them; those to be swapped start in the host layout (zeros, or
  // the parameter for a master weight) and never take device memory between steps. If
  // the layout cannot be built, the new states are removed again.
  void create_first_step_states();
  // The parameters that have state, in group order, their state tensors bound to the
  // host layout.
  std::vector<detail::Unit> collect_units();
  // Whether `param` has a gradient for step(): its .grad(), or one the host update holds.
  bool has_gradient(const at::Tensor& param) const;
  // The host update's share of the parameters (detail::host_share).
  std::vector<at::Tensor> host_share() const;
  // Which state tensors of `units` belong in the host layout, and where their contents come
  // from. `pending` lists the (parameter, slot) pairs created for this step that are to be
  // swapped: their holders are still undefined.
  std::vector<detail::StatePlacement> placements_for(const std::vector<detail::Unit>& units,
                                                     const std::vector<std::pair<const void*, int>>& pending) const;
  // Makes the host layout hold exactly `placements` (in parameter, then slot order) and
  // points their holders at their host tensors; a failure changes nothing.
  void ensure_host_layout(const std::vector<detail::StatePlacement>& placements);
  // ensure_host_layout's parts: the new layout's buffers and a host tensor per placement;
  // the copies of their contents, done once this returns.
  std::vector<at::Tensor> allocate_host_tensors(const std::vector<detail::StatePlacement>& placements,
                                                detail::HostLayout& fresh);
  void fill_host_tensors(const std::vector<detail::StatePlacement>& placements, std::vector<at::Tensor>& hosts);
  // Adam's update of one parameter that has a gradient, of `param` with `grad` (the unit's
  // own, or their host copies); its swapped states are `swapped_state(tensor)` (device
  // copies, or the host tensors), the others its own. `on_host`: FusedAdamW's pass.
  void update_unit(detail::Unit& unit, const std::function<at::Tensor(const detail::StateTensor&)>& swapped_state,
                   const at::Tensor& param, const at::Tensor& grad, bool on_host);
  // The disk tier's batches (their sizes in units, as partition_by_cost gives them):
  // swap_times, or as many more as it takes for each to fit one host buffer of
  // host_budget_bytes / buffer_count; sizes the tier's buffers. Throws InvalidArgument for
  // a parameter whose states alone do not fit a buffer.
  std::vector<int64_t> disk_batches(const std::vector<detail::Unit>& units, const std::vector<int64_t>& costs);

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<detail::WrapClaim> claim_;  // marks optimizer_ as wrapped while this wrapper lives
  SwapOptimizerConfig config_;
  SwapEnv* env_;                     // config_.env(), or the standard one
  const OptimizerAdapter* adapter_;  // the wrapped optimizer's, from the registry
  detail::Family family_;
  bool fused_on_host_ = false;      // detail::SwapTarget::fused_on_host
  std::vector<bool> swapped_slot_;  // by detail::StateSlot
  c10::Device device_;
  std::unique_ptr<memory::CopyEngine> engine_;
  std::unique_ptr<detail::HostLayout> layout_;
  std::unique_ptr<detail::DiskTier> disk_;           // with a swap_dir only
  std::unique_ptr<detail::HostUpdate> host_update_;  // with update_on_host only
  // Completes when the last download into the host buffers has; the host buffers must not
  // be read or rewritten on the CPU, nor uploaded, before it.
  memory::CopyEvent host_ready_;
  // By parameter, the step count this wrapper left its state at; one without state is at 0.
  std::unordered_map<const c10::TensorImpl*, int64_t> recorded_steps_;
};

}  // namespace stowage::optim
