#pragma once

// What this stowage was built with, as `stowage --version` prints it: its own version,
// the LibTorch it was compiled against, and whether its CUDA branches (pinned host
// buffers, CUDA streams, device memory statistics) are in. A CUDA build runs every CPU
// path on a machine without a GPU; cuda_device_count() says what this process sees.

#include <string>

namespace stowage {

struct BuildInfo {
  std::string version;           // stowage's, e.g. "0.1.0"
  std::string libtorch_version;  // of the LibTorch headers compiled against, e.g. "2.11.0"
  bool with_cuda = false;        // built with STOWAGE_WITH_CUDA
  std::string cuda_version;      // the CUDA runtime compiled against, e.g. "13.0"; empty without CUDA
  // The simulated accelerator (stowage/sim/sim.h, target stowage::sim) was built: it needs
  // LibTorch 2.x.
  bool with_sim = false;
};

BuildInfo build_info();

// The CUDA devices this process can use now: 0 in a build without CUDA, or on a machine
// without a GPU or driver.
int cuda_device_count();

// build_info() and cuda_device_count() as lines of text (no final newline), e.g.
//   stowage 0.1.0
//   LibTorch 2.11.0
//   CUDA 13.0 (0 devices visible)
//   simulated device: sim (stowage::sim)
std::string describe_build();

}  // namespace stowage
