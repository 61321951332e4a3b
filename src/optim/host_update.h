#pragma once

// The swap optimizer's update on the host (SwapOptimizerConfig::update_on_host, as
// ZeRO-Offload runs it): the chosen parameters' states never leave host memory; their
// gradients come down on the download lane (during backward, as autograd makes each one,
// and leave the device: optim/host_gradients.h; or at step()), the update runs on the
// host, and the updated parameters go back up on the upload lane, one parameter's copies
// overlapping the others' updates.
//
// The host keeps a mirror of each such device parameter: where the update writes when
// the parameter has no master (for fp32 parameters it is then the update's parameter),
// and where the rounded master goes up from. A mirror is read again from the device
// whenever the parameter has changed since it was written (its version counter or its
// storage moved: a model load, a broadcast), so it never goes stale silently.

#include <stowage/memory/copy_engine.h>

#include "optim/host_gradients.h"
#include "optim/swap_internal.h"

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace stowage::optim::detail {

// The update of one unit on the host: `param` and `grad` are host tensors (the mirror and
// the downloaded gradient, or on the CPU the parameter and its gradient themselves).
using HostUnitUpdate = std::function<void(Unit& unit, const at::Tensor& param, const at::Tensor& grad)>;

// The host's share: the first parameters of `groups`, in group order, up to `fraction`
// of all their bytes (rounded up to a whole parameter), of those whose states the host
// layout takes (floating point, at least `min_numel` elements).
std::vector<at::Tensor> host_share(const std::vector<torch::optim::OptimizerParamGroup>& groups, double fraction,
                                   int64_t min_numel);

// Moves out of `units` those of the host's share (host_share()) whose every state is in
// the host layout: a state left on the device keeps its parameter in the device's share.
std::vector<Unit> take_host_units(std::vector<Unit>& units, const std::vector<at::Tensor>& share);

class HostUpdate {
 public:
  // `offload_in_backward`: the share's gradients leave the device during backward (on a
  // device; on the CPU the update is in place and nothing moves).
  // REQUIRES: `engine` is the SwapOptimizer's and outlives this object.
  HostUpdate(memory::CopyEngine& engine, bool offload_in_backward);

  // Offloads the gradients of `share` during backward from now on, where this offloads.
  // REQUIRES: no gradient held (after run() or discard_gradients()).
  void watch(const std::vector<at::Tensor>& share);
  // Whether `param` has a gradient for the next run(): on the device, or held on the host.
  bool has_gradient(const at::Tensor& param) const;
  // For a parameter the device updates after all: its held gradient back on the device.
  void restore_gradient(const at::Tensor& param);
  // Forgets the held gradients (zero_grad()).
  void discard_gradients();

  // Updates every unit that has a gradient. On the CPU the units are updated in place.
  // On a device, returns once every updated parameter is back on the device, and the
  // gradients held on the host are used up (those left on the device stay). A failure
  // throws stowage::Error naming the cause once no copy runs, and keeps the held
  // gradients; parameters updated on the host whose upload did not complete are uploaded
  // first by the next run().
  // REQUIRES: each unit's states are host tensors; the units are those of the
  // SwapOptimizer whose engine this uses.
  void run(std::vector<Unit>& units, const HostUnitUpdate& update);

 private:
  struct Mirror {
    at::Tensor param;  // host, the parameter's dtype
    at::Tensor grad;   // host: a gradient left on the device, downloaded at run()
    // What the device parameter was when `param` last matched it.
    int64_t version = -1;
    const void* data = nullptr;
    bool ahead = false;  // updated here but not yet uploaded

    // `param` (the device parameter) now holds what this mirror holds.
    void matches(const at::Tensor& device_param) {
      version = device_param._version();
      data = device_param.data_ptr();
      ahead = false;
    }
  };

  Mirror& mirror_of(const Unit& unit);
  // Uploads the mirrors a failed run left ahead of their parameters, and waits for them.
  void upload_ahead(const std::vector<Unit>& units);
  void run_on_device(std::vector<Unit>& units, const HostUnitUpdate& update);
  at::Tensor gradient_of(const at::Tensor& param, Mirror& mirror);

  memory::CopyEngine& engine_;
  std::unique_ptr<HostGradients> gradients_;  // on a device only
  bool offload_in_backward_;
  std::unordered_map<const c10::TensorImpl*, Mirror> mirrors_;
};

}  // namespace stowage::optim::detail
