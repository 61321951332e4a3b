#pragma once

// The key of a parameter's entry in torch::optim::Optimizer::state().

#include <ATen/core/Tensor.h>

#include <sstream>
#include <type_traits>

namespace stowage::detail {

// LibTorch keys optimizer state by the parameter's TensorImpl: a pointer string in 1.13,
// the pointer itself in 2.x. The key type is read off the map, so both build.
template <typename StateMap>
typename StateMap::key_type state_key(const StateMap&, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  c10::TensorImpl* impl = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // the format c10::guts::to_string uses
    out << impl;
    return out.str();
  } else {
    return static_cast<Key>(impl);
  }
}

// The parameter's state object, or null.
template <typename StateMap>
auto* find_state(StateMap& states, const at::Tensor& param) {
  const auto it = states.find(state_key(states, param));
  return it == states.end() ? nullptr : it->second.get();
}

}  // namespace stowage::detail
