#pragma once

// Where the swap optimizer keeps the swapped states between steps, and what it builds that
// place from: each state tensor is a StateTensor (optim/param_state.h) from the wrapped
// optimizer's state object to its host tensor here.

#include "optim/param_state.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

namespace stowage::dcp {
class ScratchFile;
}  // namespace stowage::dcp

namespace stowage::optim::detail {

// Where a state's host tensor takes its contents from when the host layout is (re)built.
enum class Source {
  kZeros,       // a state created for the first step
  kHostCopy,    // a CPU tensor (the old host layout, a checkpoint), copied on the CPU
  kDeviceCopy,  // a tensor on the device, downloaded through the copy engine
};

// A state tensor the host layout is to hold: its host tensor is `shape` of `dtype`, with
// `from` copied (and cast) into it, or zeros.
struct StatePlacement {
  StateTensor state;  // state.swapped: already in the current layout, its `from` is *holder
  std::vector<int64_t> shape;
  c10::ScalarType dtype = at::kFloat;
  Source source = Source::kZeros;
  at::Tensor from;  // kHostCopy, kDeviceCopy
};

// The host tensors of the swapped states. Invariants: a state tensor is swapped when its
// holder is one of `hosts` (and no other holder met before is); in packed mode and on the
// disk tier each host tensor is a view of its dtype's buffer, which starts at storage
// offset 0, so its storage offset is its element offset there (host_offset). On the disk
// tier the buffers are mappings of the scratch files, one per dtype, so the holders are
// views of the files and nothing of them needs to be in memory.
struct HostLayout {
  bool holds(const at::Tensor& tensor) const {
    return tensor.defined() && hosts.count(tensor.unsafeGetTensorImpl()) != 0;
  }

  // By identity; owned, so that no other tensor can take the address of one.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> hosts;
  std::map<c10::ScalarType, at::Tensor> buffers;                       // packed mode and disk tier: one per dtype
  std::map<c10::ScalarType, std::shared_ptr<dcp::ScratchFile>> files;  // disk tier: the buffers' files
};

// Packed mode and disk tier: the element offset of a swapped state in its dtype's buffer.
inline int64_t host_offset(const StateTensor& state) {
  return state.holder->storage_offset();
}

}  // namespace stowage::optim::detail
