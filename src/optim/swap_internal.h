#pragma once

// Types shared by the swap optimizer's translation units.

#include <stowage/optim/swap_optimizer.h>

#include "optim/param_state.h"
#include "optim/swap_file.h"

#include <ATen/core/Tensor.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stowage::optim::detail {

// Host buffer offsets (and the staging arenas' dtype ranges) are multiples of this many
// bytes, so that every state's host and device views start aligned.
inline constexpr int64_t kAlignmentBytes = 512;

inline int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// "Float [3, 4]", for error messages.
inline std::string describe(const at::Tensor& t) {
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

// Test seam, like memory::CopyEngine's fault injector: `injector` runs before the update
// of each parameter (given its index across groups) that has a gradient; throwing from it
// fails that update before it changes anything, as an allocation failure would.
void set_update_fault_injector(SwapOptimizer& optimizer, std::function<void(int64_t param_index)> injector);

// One state tensor of a parameter.
struct UnitSlot {
  int slot;                 // StateSlot
  at::Tensor* holder;       // the tensor inside the wrapped optimizer's state object
  bool swapped = false;     // lives in the host layout
  int64_t host_offset = 0;  // packed mode: element offset in its dtype's host buffer
};

// A parameter that has optimizer state, with everything step() needs about it.
struct Unit {
  int64_t index = 0;  // the parameter's number across groups (its checkpoint id)
  size_t group = 0;
  at::Tensor param;
  bool has_grad = false;
  ParamStateRef state;
  std::vector<UnitSlot> slots;
};

// Where a state's host copy comes from when the host layout is (re)built.
enum class Source {
  kZeros,       // a state created for the first step
  kHostCopy,    // a CPU tensor (the old host layout, a checkpoint), copied on the CPU
  kDeviceCopy,  // a tensor on the device, downloaded through the copy engine
};

struct SlotRequest {
  const c10::TensorImpl* param = nullptr;
  int slot = 0;
  at::Tensor* holder = nullptr;
  std::vector<int64_t> shape;
  c10::ScalarType dtype = at::kFloat;
  Source source = Source::kZeros;
  at::Tensor from;
  bool in_place = false;  // already this slot's entry of the current host layout
};

}  // namespace stowage::optim::detail

namespace stowage::optim {

// Where each swapped state lives between steps. Invariant: each entry's holder is its
// `host` view, and entries are in parameter order, then slot order. On the disk tier the
// buffers are mappings of the scratch files, one per dtype, so the holders are views of
// the files and nothing of them needs to be in memory.
struct SwapOptimizer::HostLayout {
  struct Entry {
    const c10::TensorImpl* param;
    int slot;
    at::Tensor host;
    int64_t offset;  // packed mode: element offset in buffers[dtype]
  };
  std::vector<Entry> entries;
  std::map<std::pair<const c10::TensorImpl*, int>, size_t> index;
  std::map<c10::ScalarType, at::Tensor> buffers;                       // packed mode and disk tier: one per dtype
  std::map<c10::ScalarType, std::shared_ptr<detail::SwapFile>> files;  // disk tier: the buffers' files

  const Entry* find(const c10::TensorImpl* param, int slot) const {
    const auto it = index.find({param, slot});
    return it == index.end() ? nullptr : &entries[it->second];
  }
};

}  // namespace stowage::optim
