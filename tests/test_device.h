#pragma once

// The device the suites run their tensors on.

#include <c10/core/Device.h>
#include <torch/cuda.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>
#endif

namespace stowage::testing {

// A GPU when the build has CUDA and one is present; else, in a build against LibTorch
// 2.x, the simulated accelerator sim:0 (stowage/sim/sim.h), so that every device path
// runs, asynchronously, on every machine; else the CPU, which still runs every algorithm.
inline c10::Device pick_test_device() {
#if defined(STOWAGE_WITH_CUDA)
  if (torch::cuda::is_available()) return c10::Device(c10::kCUDA, 0);
#endif
#if defined(STOWAGE_WITH_SIM)
  sim::register_device();
  return sim::device(0);
#else
  return c10::Device(c10::kCPU);
#endif
}

// Picked while the test program loads: LibTorch's autograd engine sizes its device queues
// at the first backward, so a device registered after one could not run backward.
inline const c10::Device kTestDevice = pick_test_device();

inline c10::Device test_device() {
  return kTestDevice;
}

}  // namespace stowage::testing
