// SwapOptimizer's host layout: which state tensors are swapped, and building the host (or,
// on the disk tier, file-backed) tensors they live in between steps.

#include <stowage/memory/host_buffer.h>
#include <stowage/optim/swap_optimizer.h>

#include "optim/disk_tier.h"
#include "optim/swap_internal.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_set>

namespace stowage::optim {

using detail::Source;
using detail::StatePlacement;
using detail::StateTensor;
using detail::Unit;

namespace {

bool owns_whole_storage(const at::Tensor& t) {
  return t.layout() == at::kStrided && t.is_contiguous() && t.storage_offset() == 0 &&
         t.storage().nbytes() == t.nbytes();
}

}  // namespace

int64_t SwapOptimizer::Rep::resident_state_bytes() {
  int64_t bytes = 0;
  for (const Unit& unit : collect_units()) {
    for (const StateTensor& tensor : unit.state.tensors) {
      if (!tensor.swapped && tensor.holder->defined()) bytes += static_cast<int64_t>(tensor.holder->nbytes());
    }
  }
  return bytes;
}

std::vector<Unit> SwapOptimizer::Rep::collect_units() {
  auto& states = optimizer_->state();
  std::vector<Unit> units;
  // A host tensor is one state's: a second holder of it (a state the user aliased) is not
  // swapped, and leaves the layout when it is rebuilt.
  std::unordered_set<const c10::TensorImpl*> bound;
  int64_t index = 0;
  const auto& groups = optimizer_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const at::Tensor& param : groups[g].params()) {
      torch::optim::OptimizerParamState* state = detail::find_state(states, param);
      const int64_t this_index = index++;
      if (state == nullptr) continue;
      Unit unit;
      unit.index = this_index;
      unit.group = g;
      unit.param = param;
      unit.has_grad = has_gradient(param);
      unit.state = detail::param_state(*adapter_, *state);
      for (StateTensor& tensor : unit.state.tensors) {
        tensor.swapped = layout_->holds(*tensor.holder) && bound.insert(tensor.holder->unsafeGetTensorImpl()).second;
      }
      units.push_back(std::move(unit));
    }
  }
  return units;
}

std::vector<StatePlacement> SwapOptimizer::Rep::placements_for(
    const std::vector<Unit>& units, const std::vector<std::pair<const void*, int>>& pending) const {
  std::vector<StatePlacement> placements;
  for (const Unit& unit : units) {
    const void* param = unit.param.unsafeGetTensorImpl();
    for (const StateTensor& tensor : unit.state.tensors) {
      StatePlacement placement;
      placement.state = tensor;
      const at::Tensor& t = *tensor.holder;
      if (std::find(pending.begin(), pending.end(), std::make_pair(param, tensor.slot)) != pending.end()) {
        placement.shape = unit.param.sizes().vec();
        placement.dtype = adapter_->state_dtype(unit.param);
        if (tensor.slot == detail::kMasterParamSlot) {
          placement.source = Source::kDeviceCopy;
          placement.from = unit.param.detach();
        }
      } else {
        const bool swappable =
            tensor.swapped ||
            (t.defined() && swapped_slot_[tensor.slot] && at::isFloatingType(t.scalar_type()) &&
             t.numel() >= config_.min_numel() && owns_whole_storage(t) && (t.device() == device_ || t.is_cpu()));
        if (!swappable) continue;  // stays where it is
        placement.shape = t.sizes().vec();
        placement.dtype = t.scalar_type();
        // A swapped state is copied from its old host tensor.
        placement.source = !tensor.swapped && t.device() == device_ ? Source::kDeviceCopy : Source::kHostCopy;
        placement.from = t;
      }
      placements.push_back(std::move(placement));
    }
  }
  return placements;
}

void SwapOptimizer::Rep::ensure_host_layout(const std::vector<StatePlacement>& placements) {
  const bool unchanged =
      placements.size() == layout_->hosts.size() &&
      std::all_of(placements.begin(), placements.end(), [](const StatePlacement& p) { return p.state.swapped; });
  if (unchanged) return;

  // The old host buffers are read on the CPU below: the downloads into them must be done.
  engine_->synchronize(host_ready_);
  auto fresh = std::make_unique<detail::HostLayout>();
  std::vector<at::Tensor> hosts = allocate_host_tensors(placements, *fresh);
  fill_host_tensors(placements, hosts);
  // The holders change only once every copy has succeeded, so that a failure leaves the
  // states where they were.
  for (size_t i = 0; i < placements.size(); ++i) {
    *placements[i].state.holder = hosts[i];
    fresh->hosts.emplace(hosts[i].unsafeGetTensorImpl(), hosts[i]);
  }
  layout_ = std::move(fresh);
  host_ready_ = memory::CopyEvent();  // the downloads, if any, are done
  if (disk_) {
    disk_->stats.file_bytes = 0;
    disk_->stats.direct_io = !layout_->files.empty();
    for (const auto& [dtype, file] : layout_->files) {
      disk_->stats.file_bytes += file->size();
      disk_->stats.direct_io = disk_->stats.direct_io && file->direct();
    }
  }
}

std::vector<at::Tensor> SwapOptimizer::Rep::allocate_host_tensors(const std::vector<StatePlacement>& placements,
                                                                  detail::HostLayout& fresh) {
  // The disk tier keeps every state in its dtype's file, each at an offset O_DIRECT can
  // read from, whether the batches then move packed or per tensor.
  const bool packed = config_.packed_swap() || disk_;
  const int64_t alignment = disk_ ? detail::kDiskAlignmentBytes : detail::kAlignmentBytes;
  memory::HostAllocOptions host_options;
  host_options.pin_memory = !device_.is_cpu();
  host_options.pin_for = device_.type();
  host_options.use = memory::HostBufferUse::kOptimizer;

  std::vector<at::Tensor> hosts;
  if (!packed) {
    for (const StatePlacement& placement : placements) {
      hosts.push_back(memory::allocate_host(placement.shape, placement.dtype, host_options));
    }
    return hosts;
  }
  std::vector<int64_t> offsets;
  std::map<c10::ScalarType, int64_t> used;
  for (const StatePlacement& placement : placements) {
    const int64_t element = static_cast<int64_t>(c10::elementSize(placement.dtype));
    int64_t& end = used[placement.dtype];
    offsets.push_back(detail::align_up(end, alignment / element));
    end = offsets.back() + c10::multiply_integers(placement.shape);
  }
  for (const auto& [dtype, numel] : used) {
    if (disk_) {
      const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
      fresh.files[dtype] = disk_->files->create_scratch_file(config_.swap_dir(), "stowage-optimizer-state", bytes);
      fresh.buffers[dtype] = detail::map_scratch_file(fresh.files[dtype], dtype);
    } else {
      fresh.buffers[dtype] = memory::allocate_host({numel}, dtype, host_options);
    }
    TORCH_INTERNAL_ASSERT(fresh.buffers[dtype].storage_offset() == 0, "host_offset needs buffers at offset 0");
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    const StatePlacement& placement = placements[i];
    hosts.push_back(fresh.buffers[placement.dtype]
                        .narrow(0, offsets[i], c10::multiply_integers(placement.shape))
                        .view(placement.shape));
  }
  return hosts;
}

void SwapOptimizer::Rep::fill_host_tensors(const std::vector<StatePlacement>& placements,
                                           std::vector<at::Tensor>& hosts) {
  bool downloads = false;
  for (size_t i = 0; i < placements.size(); ++i) {
    switch (placements[i].source) {
      case Source::kZeros:
        if (!disk_) hosts[i].zero_();  // a new scratch file reads as zeros
        break;
      case Source::kHostCopy:
        hosts[i].copy_(placements[i].from);
        break;
      case Source::kDeviceCopy:
        try {
          engine_->copy(memory::CopyLane::kDeviceToHost, hosts[i], placements[i].from);
        } catch (...) {
          engine_->drain();
          throw;
        }
        downloads = true;
        break;
    }
  }
  if (downloads) {
    // Blocking here (construction, a first step, a load, the step after a failed download)
    // is what lets a failed download leave the states where they were.
    if (const std::exception_ptr failure = engine_->drain()) std::rethrow_exception(failure);
  }
}

}  // namespace stowage::optim
