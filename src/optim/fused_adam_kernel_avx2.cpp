// The fused Adam loop compiled for ATen's AVX2 CPU capability (CMakeLists.txt sets its
// flags and CPU_CAPABILITY=AVX2).
#include "optim/fused_adam_kernel_loop.h"

namespace stowage::optim::detail {

FusedAdamKernel fused_adam_kernel_avx2() {
  return &AVX2::fused_adam_loop;
}

}  // namespace stowage::optim::detail
