// The fused Adam loop compiled for ATen's AVX512 CPU capability (CMakeLists.txt sets its
// flags and CPU_CAPABILITY=AVX512).
#include "optim/fused_adam_kernel_loop.h"

namespace stowage::optim::detail {

FusedAdamKernel fused_adam_kernel_avx512() {
  return &AVX512::fused_adam_loop;
}

}  // namespace stowage::optim::detail
