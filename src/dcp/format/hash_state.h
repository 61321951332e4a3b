#pragma once

// An owned XXH3-64 streaming state, the hash of every checksum (docs/FORMAT.md).

#include <xxhash.h>

#include <memory>
#include <new>

namespace stowage::dcp::detail {

using HashState = std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)>;

// A fresh state, reset; throws std::bad_alloc when none can be made.
inline HashState new_hash_state() {
  HashState state(XXH3_createState(), XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  return state;
}

}  // namespace stowage::dcp::detail
