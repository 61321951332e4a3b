#pragma once

// What async_save copies on the caller's thread before it returns: the entries the next
// forward may write (AsyncSaveOptions), so that the background snapshot holds them as
// they were at the call.

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/saveable_state.h>

namespace stowage::dcp::detail {

// `state` with every tensor `options` names, or its Statefuls list in
// entries_written_in_forward(), replaced by a copy taken now; the other leaves stay
// shared with the caller. CPU tensors are copied into one buffer (a BatchNorm-heavy
// model has hundreds of small buffers); device tensors are cloned in their stream's
// order.
SaveableState copy_before_return(const SaveableState& state, const AsyncSaveOptions& options);

}  // namespace stowage::dcp::detail
