#pragma once

// Staging buffers for state dicts: allocate a same-structure CPU copy once, then copy
// into it as often as needed (PyTorch's _create_cpu_state_dict / _copy_state_dict).

#include <stowage/state/state_dict.h>

namespace stowage {

struct CpuStateDictOptions {
  // Page-locked memory, for fast asynchronous device-to-host copies. Granted only
  // where the build has a device that can pin (a CPU-only LibTorch cannot): check
  // memory::is_pinned() on the result's tensors. Not getting it is not an error.
  bool pin_memory = false;
  // Memory that another process can map (memfd-backed), for a checkpoint process.
  bool share_memory = false;
};

// A CPU state dict of the same structure: every tensor replaced by a contiguous CPU
// tensor of the same shape and dtype (contents uninitialised), every other leaf
// copied. Throws InvalidArgument for a state dict flatten_state_dict rejects.
StateDict create_cpu_state_dict(const StateDict& state, CpuStateDictOptions options = {});

// Copies every tensor of `src` into the tensor at the same path of `dst`, and replaces
// dst's other leaves with src's. The structures must match: the same keys, list
// lengths, tensor shapes and dtypes; with `type_check`, non-tensor leaves must also
// hold the same kind of value. Everything is checked before the first copy: on an
// exception `dst` is unchanged. With `non_blocking`, device-to-pinned copies may still
// be in flight on return; the caller synchronises the device stream.
void copy_state_dict(const StateDict& src, StateDict& dst, bool non_blocking = false,
                     bool type_check = true);

}  // namespace stowage
