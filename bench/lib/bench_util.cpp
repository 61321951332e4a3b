#include "bench_util.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>

namespace stowage::bench {

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double median(std::vector<double> values) {
  TORCH_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string temp_directory() {
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

}  // namespace stowage::bench
