#include "bench_util.h"

#include <torch/cuda.h>

#include <cstdlib>

namespace stowage::bench {

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

std::string temp_directory() {
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

}  // namespace stowage::bench
