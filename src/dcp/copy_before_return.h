#pragma once

// What async_save copies on the caller's thread before it returns: the entries the next
// forward may write (AsyncSaveOptions), so that the background snapshot holds them as
// they were at the call.

#include <stowage/dcp/checkpoint.h>
#include <stowage/state/state_dict.h>

namespace stowage::dcp::detail {

// `plain` (the state with its Statefuls resolved, `state` the caller's, `flat` the
// leaves of `plain`) with every tensor `options` names, or a Stateful of `state` lists in
// entries_written_in_forward(), replaced by a copy taken now. Only the containers on
// those entries' paths are new: `plain`, and everything it shares with the caller, stay
// as they were. CPU tensors are copied into one buffer (a BatchNorm-heavy model has
// hundreds of small buffers); device tensors are cloned in their stream's order.
StateDict copy_before_return(const StateDict& state, const StateDict& plain, const FlatStateDict& flat,
                             const AsyncSaveOptions& options);

}  // namespace stowage::dcp::detail
