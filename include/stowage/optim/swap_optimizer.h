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
// swappable state tensors are the host buffers. Drive steps through the wrapper only; these
// throw stowage::InvalidArgument:
//  - wrapping an optimizer that a live SwapOptimizer already wraps;
//  - the wrapper's step() or state_dict() after the wrapped optimizer's own step() ran.
//
// The disk tier (SwapOptimizerConfig::swap_dir) keeps the swapped states in scratch files
// instead, one per dtype, unlinked as soon as they are open (a crash leaves nothing) and
// allocated in full when made (a full disk shows then, as an IoError that changes
// nothing). The state tensors are views of the files' shared mappings: state_dict() hands
// them out without reading them, so a checkpoint streams from the files through the page
// cache, and load_state_dict() writes into them. step() reads batch b into host buffer
// b % buffer_count while earlier batches are updated, and an I/O thread writes each batch
// back from its buffer once downloaded; step() returns once every write is done. A
// failed read or write is a failure like a failed copy (below): the batches already
// updated whose write did not succeed are written again from their buffer, or, failing
// that, stay on the device until the next step, which moves them into new files. As with
// any mapping, reading a state after its disk failed under it raises SIGBUS.
//
// Failures in step():
//  - Strong guarantee for bad input: a closure, a sparse gradient, a gradient whose dtype,
//    shape or device differs from its parameter's, amsgrad without a max_exp_avg_sq state,
//    and param groups changed since wrapping so that the constructor would refuse them (a
//    parameter listed twice, or on another device).
//    These are checked before anything changes; stowage::InvalidArgument names the
//    parameter and its param group. So is a failure while the first-step states are laid
//    out on the host (e.g. a failed download of states created before wrapping).
//  - Once the updates have begun, a failure (a copy that fails, an update that throws,
//    e.g. for lack of memory) ends the step early with this guarantee: each parameter is
//    either updated (with its states and step count) or left as it was, the updated ones
//    being those with a gradient among a prefix of the parameters in group order; every
//    state on the host matches its parameter. For that, the states of an updated batch
//    whose download failed are downloaded again from the arena (which the failed download
//    keeps from being reused); if that fails too, they stay on the device, still matching,
//    until the next step moves them back. That needs memory for a device copy of the
//    batch's states: without it, the allocation failure escapes and they are lost. Each
//    parameter's update allocates before it writes, so an update that throws leaves its
//    parameter unchanged.
//  - Either way, step() returns only once no copy is running, the staging memory is
//    released, and the copy engine is usable; the exception (stowage::Error) gives the
//    cause, the batch where the update stopped and which parameters were updated.
//  So after a failure the optimizer is where the wrapped optimizer would be had the
//  parameters that were not updated had no gradient, and the next step() goes on from
//  there.

#include <stowage/memory/copy_engine.h>
#include <stowage/optim/swap_config.h>
#include <stowage/state/stateful.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace stowage {
class OptimizerAdapter;
}  // namespace stowage

namespace stowage::optim {

class SwapOptimizer;

// What the disk tier (SwapOptimizerConfig::swap_dir) has done since construction.
struct DiskTierStats {
  SwapIoPath io_path = SwapIoPath::kAuto;  // the path that runs: io_uring or threads
  bool direct_io = false;                  // whether its files bypass the page cache (O_DIRECT)
  int64_t buffer_bytes = 0;                // one host buffer's size
  int64_t peak_host_bytes = 0;             // most host memory its buffers took at once
  int64_t file_bytes = 0;                  // the scratch files' size now
  int64_t read_bytes = 0;
  int64_t written_bytes = 0;
};

namespace detail {
enum class Family;
struct DiskTier;
struct Unit;
struct UnitSlot;
struct SlotRequest;
struct WrapClaim;
void set_update_fault_injector(SwapOptimizer& optimizer, std::function<void(int64_t param_index)> injector);
enum class IoOp;
void set_disk_fault_injector(SwapOptimizer& optimizer, std::function<int(IoOp op, int64_t batch)> injector);
}  // namespace detail

class SwapOptimizer final : public Stateful {
 public:
  // Validates the config against the optimizer (throws stowage::InvalidArgument), then
  // moves any states that exist already to host buffers.
  SwapOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config);
  ~SwapOptimizer() override;

  // One update of every parameter that has a gradient. A closure is rejected: run the
  // forward and backward pass before step().
  at::Tensor step(const torch::optim::Optimizer::LossClosure& closure = nullptr);
  void zero_grad();

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  std::vector<torch::optim::OptimizerParamGroup>& param_groups() { return optimizer_->param_groups(); }
  const SwapOptimizerConfig& config() const { return config_; }
  // Copies made by the swap since construction.
  memory::CopyStats copy_stats() const { return engine_->stats(); }
  // The engine that moves the states (e.g. to install a fault injector in a test).
  memory::CopyEngine& copy_engine() { return *engine_; }
  // The disk tier's figures; throws stowage::Error on the host tier.
  DiskTierStats disk_stats() const;

  // The state in stowage::OptimizerState's layout:
  //   {"state": {"<i>": {"step": int, "exp_avg": T, ...}}, "param_groups": [...]}
  // Swapped states are the host buffers themselves (no copy); they stay valid until the
  // next step() or load_state_dict().
  StateDict state_dict() override;
  // Takes a state of that layout (from this class, or from stowage::OptimizerState of the
  // plain optimizer). Swapped states are copied straight into new host buffers, cast to
  // the state's dtype, without passing through the device.
  void load_state_dict(const StateDict& state) override;
  // Every check of load_state_dict (param groups, options, state entries), changing
  // nothing. What it cannot see: a failed download of a master taken from its parameter.
  void check_load_state_dict(const StateDict& state) override;

 private:
  struct HostLayout;

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
  // The parameters that have state, in group order, with their slots bound to the layout.
  std::vector<detail::Unit> collect_units();
  void ensure_host_layout(std::vector<detail::SlotRequest> requests);
  std::vector<detail::SlotRequest> requests_for(std::vector<detail::Unit>& units,
                                                const std::vector<std::pair<const void*, int>>& pending);
  // Adam's update of one parameter that has a gradient; its swapped states are
  // `swapped_state(slot)` (device copies), the others its own.
  void update_unit(detail::Unit& unit, const std::function<at::Tensor(const detail::UnitSlot&)>& swapped_state);
  // The disk tier's batches (their sizes in units, as partition_by_cost gives them):
  // swap_times, or as many more as it takes for each to fit one host buffer of
  // host_budget_bytes / buffer_count; sizes the tier's buffers. Throws InvalidArgument for
  // a parameter whose states alone do not fit a buffer.
  std::vector<int64_t> disk_batches(const std::vector<detail::Unit>& units, const std::vector<int64_t>& costs);
  friend void detail::set_update_fault_injector(SwapOptimizer& optimizer,
                                                std::function<void(int64_t param_index)> injector);
  friend void detail::set_disk_fault_injector(SwapOptimizer& optimizer,
                                              std::function<int(detail::IoOp op, int64_t batch)> injector);

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<detail::WrapClaim> claim_;  // marks optimizer_ as wrapped while this wrapper lives
  SwapOptimizerConfig config_;
  const OptimizerAdapter* adapter_;  // the wrapped optimizer's, from the registry
  detail::Family family_;
  std::vector<bool> swapped_slot_;  // by detail::StateSlot
  c10::Device device_;
  std::unique_ptr<memory::CopyEngine> engine_;
  std::unique_ptr<HostLayout> layout_;
  std::unique_ptr<detail::DiskTier> disk_;  // with a swap_dir only
  // Completes when the last download into the host buffers has; the host buffers must not
  // be read or rewritten on the CPU, nor uploaded, before it.
  memory::CopyEvent host_ready_;
  std::function<void(int64_t)> update_fault_;  // see detail::set_update_fault_injector
  // By parameter, the step count this wrapper left its state at; one without state is at 0.
  std::unordered_map<const c10::TensorImpl*, int64_t> recorded_steps_;
};

// Wraps a torch::optim::Adam, torch::optim::AdamW or stowage::optim::MasterAdamW.
c10::intrusive_ptr<SwapOptimizer> swap_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                                 SwapOptimizerConfig config = {});

// Whether `value` (e.g. an entry of a state dict) holds a SwapOptimizer.
bool is_swap_optimizer(const c10::IValue& value);

}  // namespace stowage::optim
