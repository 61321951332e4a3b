#pragma once

// The swap optimizer's update on the host (SwapOptimizerConfig::update_on_host, as
// ZeRO-Offload runs it): the chosen parameters' states never leave host memory; each step
// their gradients come down on the download lane, the update runs on the host, and the
// updated parameters go back up on the upload lane, one parameter's copies overlapping
// the others' updates.
//
// The host keeps a mirror of each such device parameter: where the update writes when
// the parameter has no master (for fp32 parameters it is then the update's parameter),
// and where the rounded master goes up from. A mirror is read again from the device
// whenever the parameter has changed since it was written (its version counter or its
// storage moved: a model load, a broadcast), so it never goes stale silently.

#include <stowage/memory/copy_engine.h>

#include "optim/swap_internal.h"

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <unordered_map>
#include <vector>

namespace stowage::optim::detail {

// The update of one unit on the host: `param` and `grad` are host tensors (the mirror and
// the downloaded gradient, or on the CPU the parameter and its gradient themselves).
using HostUnitUpdate = std::function<void(Unit& unit, const at::Tensor& param, const at::Tensor& grad)>;

// Moves out of `units` those updated on the host: the first parameters of `groups`, in
// group order, up to `fraction` of all their bytes (rounded up to a whole parameter),
// whose every state is in the host layout. A state left on the device (below min_numel)
// keeps its parameter in the device's share.
std::vector<Unit> take_host_units(std::vector<Unit>& units,
                                  const std::vector<torch::optim::OptimizerParamGroup>& groups, double fraction);

class HostUpdate {
 public:
  // Updates every unit that has a gradient. On the CPU the units are updated in place.
  // On a device, returns once every updated parameter is back on the device. A failure
  // throws stowage::Error naming the cause once no copy runs; parameters updated on the
  // host whose upload did not complete are uploaded first by the next run().
  // REQUIRES: each unit's states are host tensors; the units are those of one
  // SwapOptimizer, whose engine is `engine`.
  void run(memory::CopyEngine& engine, std::vector<Unit>& units, const HostUnitUpdate& update);

 private:
  struct Mirror {
    at::Tensor param;  // host, the parameter's dtype
    at::Tensor grad;   // host, the gradient's dtype
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

  Mirror& mirror_of(memory::CopyEngine& engine, const Unit& unit);
  // Uploads the mirrors a failed run left ahead of their parameters, and waits for them.
  void upload_ahead(memory::CopyEngine& engine, const std::vector<Unit>& units);
  void run_on_device(memory::CopyEngine& engine, std::vector<Unit>& units, const HostUnitUpdate& update);

  std::unordered_map<const c10::TensorImpl*, Mirror> mirrors_;
};

}  // namespace stowage::optim::detail
