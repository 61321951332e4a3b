#include "optim/fused_adam_kernel.h"

#include <c10/util/Exception.h>

namespace stowage::optim::detail {

bool cpu_runs(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::kDefault:
      return true;
#if defined(__x86_64__)
    case CpuCapability::kAvx2:
      // (Its flags add F16C, which every CPU with AVX2 has; clang can't name it here.)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuCapability::kAvx512:
      // ATen's AVX512 kernels need these four (its cpuinfo check does the same).
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
    default:
      return false;
  }
}

FusedAdamKernel fused_adam_kernel(CpuCapability capability) {
  TORCH_INTERNAL_ASSERT(cpu_runs(capability), "fused Adam: this CPU or build has no such kernel");
  switch (capability) {
#if defined(__x86_64__)
    case CpuCapability::kAvx512:
      return fused_adam_kernel_avx512();
    case CpuCapability::kAvx2:
      return fused_adam_kernel_avx2();
#endif
    default:
      return fused_adam_kernel_default();
  }
}

FusedAdamKernel fused_adam_kernel() {
  static const FusedAdamKernel widest = [] {
    for (const auto capability : {CpuCapability::kAvx512, CpuCapability::kAvx2}) {
      if (cpu_runs(capability)) return fused_adam_kernel(capability);
    }
    return fused_adam_kernel_default();
  }();
  return widest;
}

}  // namespace stowage::optim::detail
