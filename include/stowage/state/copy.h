#pragma once

// Staging buffers for state dicts: allocate a same-structure CPU copy once, then copy
// into it as often as needed (PyTorch's _create_cpu_state_dict / _copy_state_dict).

#include <stowage/state/state_dict.h>

#include <string>

namespace stowage {

struct CpuStateDictOptions {
  // Page-locked memory for the device the state's tensors live on, for fast asynchronous
  // device-to-host copies. Granted only where that device's runtime can pin (a CPU-only
  // LibTorch cannot; a device other than CUDA cannot pin shared memory): check
  // memory::is_pinned() on the result's tensors. Not getting it is not an error.
  bool pin_memory = false;
  // Memory that another process can map (memfd-backed), for a checkpoint process.
  bool share_memory = false;
};

// A copy of a non-tensor leaf that shares nothing mutable with it: a list leaf (e.g. a
// c10::List<double>) becomes a new list of the same element type, an empty dict a new
// empty dict of the same key and value types; the other leaves (numbers, bool, string,
// None) are immutable and returned as they are. A tensor is returned as it is.
c10::IValue copy_leaf(const c10::IValue& leaf);

// The largest arena create_cpu_state_dict packs small tensors into: small enough that
// a snapshot whose tensors are dropped one by one as they are written (an uncached
// async_save) frees its memory as it goes.
constexpr int64_t kCpuStateDictArenaBytes = int64_t(1) << 20;

// A CPU state dict of the same structure: every tensor replaced by a contiguous CPU
// tensor of the same shape and dtype (contents uninitialised), every other leaf
// copied (copy_leaf). Tensors smaller than kCpuStateDictArenaBytes share arenas
// (memory::allocate_host_tensors): descriptors, mappings and pin registrations grow
// with the bytes, not the number of tensors. Throws InvalidArgument for a state dict flatten_state_dict rejects.
StateDict create_cpu_state_dict(const StateDict& state, CpuStateDictOptions options = {});
// The same over leaves already flattened.
FlatStateDict create_cpu_state_dict(const FlatStateDict& flat, CpuStateDictOptions options = {});

// Copies every tensor of `src` into the tensor at the same path of `dst`, and replaces
// dst's other leaves with copies of src's (copy_leaf): dst shares nothing mutable with
// src. The structures must match: the same keys, list
// lengths, tensor shapes and dtypes; with `type_check`, non-tensor leaves must also
// hold the same kind of value. Everything is checked before the first copy: on an
// exception `dst` is unchanged. With `non_blocking`, device-to-pinned copies may still
// be in flight on return; the caller synchronises the device stream.
void copy_state_dict(const StateDict& src, StateDict& dst, bool non_blocking = false, bool type_check = true);
// The same over leaves already flattened: copies src's tensors into dst's and returns
// dst's tensors with copies of src's other leaves, in src's order.
FlatStateDict copy_state_dict(const FlatStateDict& src, const FlatStateDict& dst, bool non_blocking = false,
                              bool type_check = true);

// Why copy_state_dict(src, dst, ..., type_check) would refuse the two structures (the
// message its InvalidArgument would carry), or an empty string when it would copy.
std::string state_dict_mismatch(const StateDict& src, const StateDict& dst, bool type_check = true);
std::string state_dict_mismatch(const FlatStateDict& src, const FlatStateDict& dst, bool type_check = true);

}  // namespace stowage
