// The fused Adam loop compiled for ATen's DEFAULT CPU capability (CMakeLists.txt sets its
// flags and CPU_CAPABILITY=DEFAULT).
#include "optim/fused_adam_kernel_loop.h"

namespace stowage::optim::detail {

FusedAdamKernel fused_adam_kernel_default() {
  return &DEFAULT::fused_adam_loop;
}

}  // namespace stowage::optim::detail
