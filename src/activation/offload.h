#pragma once

// The inputs a checkpoint keeps for its recomputation, held in host memory between the
// forward and the backward instead of on their device (CheckpointOptions::offload_inputs).

#include <stowage/activation/checkpoint.h>
#include <stowage/memory/copy_engine.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace stowage::activation {

class OffloadedInputs {
 public:
  // Starts copying `tensors` (on engine's device) to host memory on the device-to-host
  // lane, after the compute work issued so far, which produced them. The device memory
  // is the allocator's again once the copies have run: the engine holds it until then.
  OffloadedInputs(std::shared_ptr<memory::CopyEngine> engine, const std::vector<at::Tensor>& tensors);

  // Starts bringing the tensors back to the device on the host-to-device lane, unless that
  // has started already.
  void prefetch();
  // The tensors on the device again, with their shape and strides (where those overlap
  // nothing) and requires_grad; work issued on the compute side from now on runs after
  // their copies. The host copies stay for another backward (retain_graph), which brings
  // them back again.
  std::vector<at::Tensor> take();

 private:
  struct Offloaded {
    at::Tensor host;  // contiguous
    std::vector<int64_t> sizes;
    std::vector<int64_t> strides;  // empty: restore contiguous
    bool requires_grad;
  };
  std::shared_ptr<memory::CopyEngine> engine_;
  std::vector<Offloaded> offloaded_;
  memory::CopyEvent on_host_;     // the downloads are done
  std::vector<at::Tensor> back_;  // on the device, once prefetch() ran
  memory::CopyEvent on_device_;   // the uploads into back_ are done
};

// The chain of checkpoints one checkpoint_sequential call makes: their copy engine, and
// the offloaded inputs of the latest, which the next one prefetches in backward.
struct OffloadChain {
  std::shared_ptr<memory::CopyEngine> engine;
  std::shared_ptr<OffloadedInputs> last;
};

// checkpoint(fn, inputs, options) as the next checkpoint of `chain` (null: of none).
std::vector<c10::IValue> checkpoint_in_chain(const CheckpointFunction& fn, const std::vector<c10::IValue>& inputs,
                                             const CheckpointOptions& options, OffloadChain* chain);

}  // namespace stowage::activation
