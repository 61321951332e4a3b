#include <stowage/optim/swap_env.h>

namespace stowage::optim {

SwapEnv* SwapEnv::standard() {
  static SwapEnv* const env = new SwapEnv();
  return env;
}

void SwapEnv::before_update(int64_t /*param_index*/) {}

}  // namespace stowage::optim
