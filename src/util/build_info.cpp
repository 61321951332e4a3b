// With the memory module because what it reports is the device runtime that module
// pins and accounts through.
#include <stowage/build_info.h>
#include <stowage/version.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>
#include <torch/version.h>

#if defined(STOWAGE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace stowage {

BuildInfo build_info() {
  BuildInfo info;
  info.version = STOWAGE_VERSION;
  info.libtorch_version = TORCH_VERSION;
#if defined(STOWAGE_WITH_CUDA)
  info.with_cuda = true;
  info.cuda_version = fmt::format("{}.{}", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
#endif
#if defined(STOWAGE_WITH_SIM)
  info.with_sim = true;
#endif
  return info;
}

int cuda_device_count() {
#if defined(STOWAGE_WITH_CUDA)
  // Through LibTorch's hooks, which answer 0 instead of failing without a driver.
  return at::detail::getCUDAHooks().hasCUDA() ? at::detail::getCUDAHooks().getNumGPUs() : 0;
#else
  return 0;
#endif
}

std::string describe_build() {
  const BuildInfo info = build_info();
  std::string text = fmt::format("stowage {}\nLibTorch {}\n", info.version, info.libtorch_version);
  if (info.with_cuda) {
    const int devices = cuda_device_count();
    text += fmt::format("CUDA {} ({} device{} visible)", info.cuda_version, devices, devices == 1 ? "" : "s");
  } else {
    text += "CUDA: not compiled in";
  }
  return text + (info.with_sim ? "\nsimulated device: sim (stowage::sim)"
                               : "\nsimulated device: not built (it needs LibTorch 2.x)");
}

}  // namespace stowage
