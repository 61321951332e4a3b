#pragma once

// Optimizer-state swap for Adam-family optimizers: between steps the moments (optionally
// the fp32 master weights) live in host memory, or on disk, and hold no device memory;
// step() brings them up in `swap_times` batches, one batch ahead, with at most two
// batches' states on the device. Parameters and states match the unwrapped optimizer's
// bit for bit. docs/swap.md describes the pipeline, the disk tier and what a failed step
// leaves behind.
//
//   auto adam = std::make_shared<torch::optim::AdamW>(model->parameters());
//   auto optimizer = stowage::optim::swap_optimizer(adam, SwapOptimizerConfig().swap_times(4));
//   ... loss.backward(); optimizer->step(); optimizer->zero_grad();
//
// Thread safety: one thread at a time may call a SwapOptimizer, as with any
// torch::optim::Optimizer.

#include <stowage/memory/copy_engine.h>
#include <stowage/optim/swap_config.h>
#include <stowage/state/stateful.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace stowage::optim {

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

class SwapOptimizer final : public Stateful {
 public:
  // Validates the config against the optimizer and moves the states that exist already to
  // the host (or disk) tier, blocking until they are there.
  // REQUIRES: `optimizer` is a torch::optim::Adam, AdamW or stowage::optim::MasterAdamW,
  // its parameters all on one device, and no live SwapOptimizer wraps it (each of these
  // throws stowage::InvalidArgument otherwise). While the wrapper lives it claims the
  // optimizer (state/optimizer_adapter.h): stowage::OptimizerState, and so
  // as_ivalue(optimizer), refuses it, and checkpoints go through the wrapper.
  SwapOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config);
  ~SwapOptimizer() override;

  // One update of every parameter that has a gradient.
  // REQUIRES: no closure (run forward and backward first), and the wrapped optimizer's own
  // step() has not run since wrapping.
  // Bad input (see docs/swap.md) throws stowage::InvalidArgument before anything changes.
  // A failure once the updates have begun throws stowage::Error, naming the cause and the
  // parameters updated: each parameter is then either updated or as it was, and every
  // state on the host matches its parameter, so the next step() goes on from there.
  // With update_on_host and offload_gradients_in_backward on a device, the gradients of
  // the host's share are held on the host since backward (their .grad() undefined), and
  // step() uses them up (docs/swap.md, "Gradients").
  at::Tensor step(const torch::optim::Optimizer::LossClosure& closure = nullptr);
  // The wrapped optimizer's zero_grad(), and discards the gradients held on the host.
  void zero_grad();

  // The wrapped optimizer: it keeps owning the param groups and the state objects, whose
  // swapped tensors are the host buffers. Drive steps, saves and restores through the
  // wrapper only.
  torch::optim::Optimizer& optimizer();
  std::vector<torch::optim::OptimizerParamGroup>& param_groups();
  const SwapOptimizerConfig& config() const;
  // Copies made by the swap since construction.
  memory::CopyStats copy_stats() const;
  // The engine that moves the states.
  memory::CopyEngine& copy_engine();
  // The disk tier's figures. REQUIRES: a swap_dir (stowage::Error otherwise).
  DiskTierStats disk_stats() const;
  // The bytes of the states that stay on the device between steps (those not swapped:
  // below min_numel, of keys not swapped, or left there by a failed step), counted from
  // the state tensors. Unlike memory::memory_allocated(device) before and after, it does
  // not count what other threads hold meanwhile (a background checkpoint save's buffers).
  int64_t resident_state_bytes() const;

  // The state in stowage::OptimizerState's layout:
  //   {"state": {"<i>": {"step": int, "exp_avg": T, ...}}, "param_groups": [...]}
  // Swapped states are the host buffers themselves (no copy); they stay valid until the
  // next step() or load_state_dict().
  StateDict state_dict() override;
  // Takes a state of that layout (from this class, or from stowage::OptimizerState of the
  // plain optimizer). Swapped states are copied straight into new host buffers, cast to
  // the state's dtype, without passing through the device. Changes nothing if it throws.
  void load_state_dict(const StateDict& state) override;
  // Every check of load_state_dict (param groups, options, state entries), changing
  // nothing. What it cannot see: a failed download of a master taken from its parameter.
  void check_load_state_dict(const StateDict& state) override;

 private:
  struct Rep;  // src/optim/swap_internal.h
  std::unique_ptr<Rep> rep_;
};

// Wraps a torch::optim::Adam, torch::optim::AdamW or stowage::optim::MasterAdamW.
c10::intrusive_ptr<SwapOptimizer> swap_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                                 SwapOptimizerConfig config = {});

// The least SwapOptimizerConfig::host_budget_bytes with which the disk tier can swap an
// Adam's or AdamW's states of `params` (two a parameter, three with amsgrad, in its dtype;
// those of min_numel elements or more): buffer_count buffers, each holding the largest
// parameter's states. A smaller budget makes the first step() throw InvalidArgument; a
// caller checks its own option against this first, to refuse it under its own name.
int64_t min_disk_host_budget(const std::vector<at::Tensor>& params, const SwapOptimizerConfig& config,
                             bool amsgrad = false);

// Whether `value` (e.g. an entry of a state dict) holds a SwapOptimizer.
bool is_swap_optimizer(const c10::IValue& value);

}  // namespace stowage::optim
