#pragma once

// The gradients of the parameters the swap updates on the host (SwapOptimizerConfig::
// update_on_host), held in host memory: ZeRO-Offload's gradient path. Each parameter has
// one pinned host buffer, its gradient since the last step().
//
// During backward (watch()): a post-hook on each watched parameter's AccumulateGrad node
// copies the gradient autograd has just accumulated to the host on the copy engine's
// download lane and resets the parameter's .grad(), so the gradients hold no device
// memory between the backward that makes them and the step() that uses them. The lane's
// copy marks the device memory in use on its stream (the engine's record-stream rule), so
// the allocator hands it out again only once the copy has run. A second backward before
// step() adds its gradient to the one held (on the host, in the gradient's dtype, as
// autograd's accumulation would on the device).
//
// A gradient still on the device at step() (its parameter not watched, a gradient set by
// hand, or offload during backward off) is the host update's to download; it adds to the
// one held here, which stays as it is until clear().
//
// Invariant: a held gradient's buffer is read on the host only after the copies into it
// have completed (take() synchronizes with them).
//
// Thread safety: the hooks run on the backward's threads; they and the methods serialise
// on one mutex. No method may run while a backward over the watched parameters runs.

#include <stowage/memory/copy_engine.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace stowage::optim::detail {

// A host tensor of `like`'s sizes and dtype for the host update (its mirrors and held
// gradients): pinned for `device_type` where that device can pin, counted as the
// optimizer's host memory.
at::Tensor pinned_host_like(const at::Tensor& like, c10::DeviceType device_type);

class HostGradients {
 public:
  // REQUIRES: `engine` is not on the CPU and outlives this object.
  explicit HostGradients(memory::CopyEngine& engine);
  ~HostGradients();  // removes the hooks
  HostGradients(const HostGradients&) = delete;
  HostGradients& operator=(const HostGradients&) = delete;

  // Offloads the gradients of exactly `params` during backward from now on: hooks the
  // ones not hooked yet (or whose AccumulateGrad node changed: a Module::to round trip
  // makes a new one), unhooks the others. REQUIRES: no gradient held (after clear()).
  void watch(const std::vector<at::Tensor>& params);

  // Whether a gradient of `param` is held on the host.
  bool holds(const at::Tensor& param) const;
  // The held gradient of `param`, once every copy into it has run (rethrows a failed
  // copy's error); read it only until the next backward. REQUIRES: holds(param).
  at::Tensor take(const at::Tensor& param);
  // Puts a held gradient back on the device as `param`'s .grad() (added to a device
  // gradient set since), for a parameter updated on the device after all; releases it.
  void restore_to_device(const at::Tensor& param);
  // Forgets every held gradient (step() used them, or zero_grad()); keeps the buffers.
  void clear();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace stowage::optim::detail
