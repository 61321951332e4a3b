#include "activation/nested_tensors.h"

namespace stowage::activation {

void for_each_tensor(const c10::IValue& value, const std::function<void(const at::Tensor&)>& visit) {
  if (value.isTensor()) {
    if (value.toTensor().defined()) {
      visit(value.toTensor());
    }
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      for_each_tensor(element, visit);
    }
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      for_each_tensor(element, visit);
    }
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      for_each_tensor(entry.key(), visit);
      for_each_tensor(entry.value(), visit);
    }
  }
}

}  // namespace stowage::activation
