#include <stowage/activation/tensor_like.h>

namespace stowage::activation {

bool is_tensor_like(const c10::IValue& value) {
  return value.isTensor() && value.toTensor().defined();
}

}  // namespace stowage::activation
