#pragma once

// XXH3-64, the hash of every checksum (docs/FORMAT.md), and an owned streaming state.
// Every file of stowage that hashes includes this header, not <xxhash.h>: where
// libxxhash offers its x86 dispatch (Debian's does; STOWAGE_XXH3_DISPATCH), XXH3_64bits
// and XXH3_64bits_update become the dispatched versions, which pick AVX2 or AVX-512 at
// run time instead of the SSE2 baseline the library is built for: the checksums of
// every save and load run at about twice the speed, the same hashes.

#include <xxhash.h>
#if defined(STOWAGE_XXH3_DISPATCH)
#include <xxh_x86dispatch.h>
#endif

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
