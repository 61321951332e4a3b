#pragma once

// is_tensor_like: the C++ meaning of torch.overrides.is_tensor_like.
//
// Python answers True for a torch.Tensor (or an instance of a subclass) and for an
// object whose class defines __torch_function__, i.e. a class that asks to be treated
// as a tensor by torch's API. The C++ counterparts:
//   - at::Tensor and any class derived from at::TensorBase: tensor-like when defined.
//     An undefined tensor is how C++ spells Python's None in a tensor slot, and
//     is_tensor_like(None) is False.
//   - c10::IValue: tensor-like when it holds a defined tensor. A list, tuple or dict of
//     tensors is not (as a Python list of tensors is not).
//   - c10::optional<T>: tensor-like when it holds a tensor-like value.
//   - any other type: tensor-like when it opts in by specialising TensorLikeTraits —
//     the C++ analogue of defining __torch_function__ on a class.
// Like Python's, the test is shallow: it looks at the value itself, never inside it.

#include <ATen/core/TensorBase.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Optional.h>

#include <type_traits>

namespace stowage::activation {

// Specialise with `: std::true_type` to make every value of T tensor-like.
template <typename T>
struct TensorLikeTraits : std::false_type {};

bool is_tensor_like(const c10::IValue& value);

template <typename T>
bool is_tensor_like(const T& value) {
  if constexpr (std::is_base_of_v<at::TensorBase, T>) {
    return value.defined();
  } else {
    return TensorLikeTraits<T>::value;
  }
}

template <typename T>
bool is_tensor_like(const c10::optional<T>& value) {
  return value.has_value() && is_tensor_like(*value);
}

}  // namespace stowage::activation
