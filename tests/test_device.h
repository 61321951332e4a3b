#pragma once

// The device the suites run their tensors on.

#include <c10/core/Device.h>
#include <torch/cuda.h>

namespace stowage::testing {

// The build's accelerator when it has one and a device is present, else the CPU: a CPU
// run still runs every algorithm, and a GPU run runs the same tests on the device.
inline c10::Device test_device() {
#if defined(STOWAGE_WITH_CUDA)
  if (torch::cuda::is_available()) return c10::Device(c10::kCUDA, 0);
#endif
  return c10::Device(c10::kCPU);
}

}  // namespace stowage::testing
