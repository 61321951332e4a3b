#pragma once

// Optimizer-state swap for Adam-family optimizers.
//
// Between steps, the swappable states (the moments, optionally the fp32 master weights)
// live in host buffers and hold no device memory. step() splits the parameters into
// `swap_times` batches of similar byte size and pipelines them: the next batch's states
// are uploaded and the previous batch's downloaded while the current batch is updated,
// with at most two batches' states on the device at any time. Uploads and downloads run
// on separate copy lanes (memory::CopyEngine).
//
// Numerics are exactly those of the wrapped optimizer: the update performs the same
// tensor operations, so parameters and states match the unwrapped optimizer's bit for bit.
//
//   auto adam = std::make_shared<torch::optim::AdamW>(model->parameters());
//   auto optimizer = stowage::optim::swap_optimizer(adam, SwapOptimizerConfig().swap_times(4));
//   ... loss.backward(); optimizer->step(); optimizer->zero_grad();
//
// The wrapped optimizer keeps owning the parameter groups and the state objects; its
// swappable state tensors are the host buffers. Drive steps through the wrapper only.

#include <stowage/memory/copy_engine.h>
#include <stowage/optim/swap_config.h>
#include <stowage/state/stateful.h>

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

namespace stowage::optim {

namespace detail {
enum class Family;
struct Unit;
struct SlotRequest;
}  // namespace detail

class SwapOptimizer final : public Stateful {
 public:
  // Validates the config against the optimizer (throws stowage::InvalidArgument), then
  // moves any states that exist already to host buffers.
  SwapOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config);
  ~SwapOptimizer() override;

  // One update of every parameter that has a gradient. A closure is rejected: run the
  // forward and backward pass before step().
  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr);
  void zero_grad();

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() { return optimizer_->param_groups(); }
  const SwapOptimizerConfig& config() const { return config_; }
  // Copies made by the swap since construction.
  memory::CopyStats copy_stats() const { return engine_->stats(); }

  // The state in stowage::OptimizerState's layout:
  //   {"state": {"<i>": {"step": int, "exp_avg": T, ...}}, "param_groups": [...]}
  // Swapped states are the host buffers themselves (no copy); they stay valid until the
  // next step() or load_state_dict().
  StateDict state_dict() override;
  // Takes a state of that layout (from this class, or from stowage::OptimizerState of the
  // plain optimizer). Swapped states are copied straight into new host buffers, cast to
  // the state's dtype, without passing through the device.
  void load_state_dict(const StateDict& state) override;

 private:
  struct HostLayout;

  // The parameters that have state, in group order, with their slots bound to the layout.
  std::vector<detail::Unit> collect_units();
  void ensure_host_layout(std::vector<detail::SlotRequest> requests);
  std::vector<detail::SlotRequest> requests_for(std::vector<detail::Unit>& units,
                                                const std::vector<std::pair<const void*, int>>& pending);
  void run_packed(std::vector<detail::Unit>& units, const std::vector<int64_t>& batch_sizes);
  void run_per_tensor(std::vector<detail::Unit>& units, const std::vector<int64_t>& batch_sizes);
  void update_unit(detail::Unit& unit, const std::vector<at::Tensor>& tensors);

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  SwapOptimizerConfig config_;
  detail::Family family_;
  std::vector<bool> swapped_slot_;  // by detail::StateSlot
  c10::Device device_;
  std::unique_ptr<memory::CopyEngine> engine_;
  std::unique_ptr<HostLayout> layout_;
  // Completes when the last download into the host buffers has; the host buffers must not
  // be read or rewritten on the CPU, nor uploaded, before it.
  memory::CopyEvent host_ready_;
};

// Wraps a torch::optim::Adam, torch::optim::AdamW or stowage::optim::MasterAdamW.
c10::intrusive_ptr<SwapOptimizer> swap_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                                 SwapOptimizerConfig config = {});

// Whether `value` (e.g. an entry of a state dict) holds a SwapOptimizer.
bool is_swap_optimizer(const c10::IValue& value);

}  // namespace stowage::optim
