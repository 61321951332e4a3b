#pragma once

// The generator states a checkpoint replays its recomputation from.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <utility>
#include <vector>

namespace stowage::activation {

// The states of the CPU generator and of the default generator of each device the
// given values' tensors live on (searched through lists, tuples and dicts, as
// PyTorch's tree_map does). Only generators of devices holding a tensor are read, so
// no unused device is initialised.
class RngSnapshot {
 public:
  static RngSnapshot capture(const std::vector<c10::IValue>& values);

 private:
  friend class RngReplay;
  std::vector<std::pair<at::Generator, at::Tensor>> states_;
};

// While alive, the snapshot's generators run from the snapshot's states; on
// destruction (also by exception) they get back the states they had before.
class RngReplay {
 public:
  explicit RngReplay(const RngSnapshot& snapshot);
  ~RngReplay();
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  RngSnapshot saved_;
};

}  // namespace stowage::activation
