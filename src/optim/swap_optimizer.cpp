#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/optim/partition.h>
#include <stowage/optim/swap_optimizer.h>

#include "exception_message.h"
#include "optim/adam_update.h"
#include "optim/swap_internal.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <type_traits>

namespace stowage::optim {

using detail::describe;
using detail::Family;
using detail::SlotRequest;
using detail::Source;
using detail::Unit;
using detail::UnitSlot;
using memory::CopyEvent;
using memory::CopyLane;

namespace {

int64_t align_up(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

int64_t nbytes(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

bool amsgrad_of(Family family, const torch::optim::OptimizerOptions& options) {
  return family == Family::kAdam ? static_cast<const torch::optim::AdamOptions&>(options).amsgrad()
                                 : static_cast<const torch::optim::AdamWOptions&>(options).amsgrad();
}

// The dtype a state of `slot` has for `param`: the parameter's, or fp32 for the states of
// an optimizer that keeps fp32 masters.
c10::ScalarType state_dtype(Family family, const at::Tensor& param) {
  return family == Family::kMasterAdamW ? at::kFloat : param.scalar_type();
}

}  // namespace

// ------------------------------------------------------------------ construction

SwapOptimizer::SwapOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, SwapOptimizerConfig config)
    : optimizer_(std::move(optimizer)), config_(std::move(config)), device_(c10::kCPU) {
  if (!optimizer_) {
    throw InvalidArgument("swap_optimizer: null optimizer");
  }
  family_ = detail::family_of(*optimizer_);
  swapped_slot_.assign(detail::kSlotCount, false);
  for (const std::string& key : config_.swapped_keys()) {
    const int slot = detail::slot_of(key);
    if (!detail::family_has_slot(family_, slot)) {
      throw InvalidArgument(
          fmt::format("Requested state key '{}' is not available for {}.", key, detail::family_name(family_)));
    }
    swapped_slot_[slot] = true;
  }
  const auto& groups = optimizer_->param_groups();
  for (const auto& group : groups) {
    if (!group.params().empty()) {
      device_ = group.params().front().device();
      break;
    }
  }
  check_param_groups();
  engine_ = std::make_unique<memory::CopyEngine>(device_);
  layout_ = std::make_unique<HostLayout>();

  // States created before wrapping go to the host now, so that they hold no device memory
  // during the forward and backward pass. Blocking here, once, means that when the wrapper
  // is returned that memory is free and the host copies are complete.
  std::vector<Unit> units = collect_units();
  ensure_host_layout(requests_for(units, {}));
  engine_->synchronize(host_ready_);
}

SwapOptimizer::~SwapOptimizer() = default;

void SwapOptimizer::check_param_groups() const {
  const auto& groups = optimizer_->param_groups();
  // One copy engine serves one device, and the state of a parameter listed twice would be
  // updated twice per step.
  std::map<const c10::TensorImpl*, std::pair<size_t, size_t>> seen;  // group and index
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      if (params[p].device() != device_) {
        throw InvalidArgument(fmt::format(
            "swap_optimizer: parameter {} of param group {} is on {}, but the other parameters are on {}; the "
            "swap serves one device",
            p, g, params[p].device().str(), device_.str()));
      }
      const auto [first, inserted] = seen.emplace(params[p].unsafeGetTensorImpl(), std::make_pair(g, p));
      if (!inserted) {
        throw InvalidArgument(fmt::format(
            "swap_optimizer: parameter {} of param group {} is also parameter {} of param group {}; a parameter "
            "listed twice would be updated twice per step",
            p, g, first->second.second, first->second.first));
      }
    }
  }
  const auto& explicit_keys = config_.state_keys();
  if (std::find(explicit_keys.begin(), explicit_keys.end(), kMaxExpAvgSq) != explicit_keys.end() &&
      std::none_of(groups.begin(), groups.end(), [&](const auto& g) { return amsgrad_of(family_, g.options()); })) {
    throw InvalidArgument(fmt::format(
        "Requested state key 'max_exp_avg_sq' is not present for any parameter: no param group of the {} has "
        "amsgrad enabled.",
        detail::family_name(family_)));
  }
}

c10::intrusive_ptr<SwapOptimizer> swap_optimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                                 SwapOptimizerConfig config) {
  return c10::make_intrusive<SwapOptimizer>(std::move(optimizer), std::move(config));
}

bool is_swap_optimizer(const c10::IValue& value) {
  const c10::intrusive_ptr<Stateful> stateful = as_stateful(value);
  return stateful && dynamic_cast<SwapOptimizer*>(stateful.get()) != nullptr;
}

void SwapOptimizer::zero_grad() {
  optimizer_->zero_grad();
}

// ------------------------------------------------------------------ host layout

std::vector<Unit> SwapOptimizer::collect_units() {
  auto& states = optimizer_->state();
  std::vector<Unit> units;
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
      unit.has_grad = param.grad().defined();
      unit.state = detail::state_ref(family_, *state);
      for (int slot = 0; slot < detail::kSlotCount; ++slot) {
        at::Tensor* holder = unit.state.tensors[slot];
        if (holder == nullptr) continue;
        UnitSlot entry{slot, holder};
        if (const HostLayout::Entry* e = layout_->find(param.unsafeGetTensorImpl(), slot);
            e != nullptr && holder->defined() && holder->is_same(e->host)) {
          entry.swapped = true;
          entry.host_offset = e->offset;
        }
        unit.slots.push_back(entry);
      }
      units.push_back(std::move(unit));
    }
  }
  return units;
}

// Which state tensors belong in the host layout, and where their contents come from.
// `pending` lists the (parameter, slot) pairs created for this step that are to be
// swapped: their holders are still undefined.
std::vector<SlotRequest> SwapOptimizer::requests_for(std::vector<Unit>& units,
                                                     const std::vector<std::pair<const void*, int>>& pending) {
  const int64_t min_numel = config_.min_numel();
  auto owns_whole_storage = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && t.is_contiguous() && t.storage_offset() == 0 &&
           static_cast<int64_t>(t.storage().nbytes()) == nbytes(t);
  };
  std::vector<SlotRequest> requests;
  for (Unit& unit : units) {
    const c10::TensorImpl* impl = unit.param.unsafeGetTensorImpl();
    for (UnitSlot& slot : unit.slots) {
      SlotRequest request;
      request.param = impl;
      request.slot = slot.slot;
      request.holder = slot.holder;
      const bool is_pending = std::find(pending.begin(), pending.end(),
                                        std::make_pair(static_cast<const void*>(impl), slot.slot)) != pending.end();
      if (is_pending) {
        request.shape = unit.param.sizes().vec();
        request.dtype = state_dtype(family_, unit.param);
        if (slot.slot == detail::kMasterParamSlot) {
          request.source = Source::kDeviceCopy;
          request.from = unit.param.detach();
        }
      } else if (slot.swapped) {
        request.shape = slot.holder->sizes().vec();
        request.dtype = slot.holder->scalar_type();
        request.source = Source::kHostCopy;
        request.from = *slot.holder;
        request.in_place = true;
      } else {
        const at::Tensor& t = *slot.holder;
        const bool swappable = t.defined() && swapped_slot_[slot.slot] && at::isFloatingType(t.scalar_type()) &&
                               t.numel() >= min_numel && owns_whole_storage(t) && (t.device() == device_ || t.is_cpu());
        if (!swappable) continue;  // stays where it is
        request.shape = t.sizes().vec();
        request.dtype = t.scalar_type();
        request.source = t.device() == device_ ? Source::kDeviceCopy : Source::kHostCopy;
        request.from = t;
      }
      requests.push_back(std::move(request));
    }
  }
  return requests;
}

void SwapOptimizer::ensure_host_layout(std::vector<SlotRequest> requests) {
  const bool unchanged = requests.size() == layout_->entries.size() &&
                         std::all_of(requests.begin(), requests.end(), [](const SlotRequest& r) { return r.in_place; });
  if (unchanged) return;

  // The old host buffers are read on the CPU below: the downloads into them must be done.
  engine_->synchronize(host_ready_);

  const bool packed = config_.packed_swap();
  memory::HostAllocOptions host_options;
  host_options.pin_memory = !device_.is_cpu();

  auto fresh = std::make_unique<HostLayout>();
  std::vector<int64_t> offsets(requests.size(), 0);
  if (packed) {
    std::map<c10::ScalarType, int64_t> used;
    for (size_t i = 0; i < requests.size(); ++i) {
      const int64_t element = static_cast<int64_t>(c10::elementSize(requests[i].dtype));
      int64_t& end = used[requests[i].dtype];
      offsets[i] = align_up(end, detail::kAlignmentBytes / element);
      end = offsets[i] + c10::multiply_integers(requests[i].shape);
    }
    for (const auto& [dtype, numel] : used) {
      fresh->buffers[dtype] = memory::allocate_host({numel}, dtype, host_options);
    }
  }
  // The holders change only once every copy has succeeded, so that a failure leaves the
  // states where they were.
  std::vector<at::Tensor> hosts;
  bool downloads = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    SlotRequest& request = requests[i];
    const int64_t numel = c10::multiply_integers(request.shape);
    at::Tensor host = packed ? fresh->buffers[request.dtype].narrow(0, offsets[i], numel).view(request.shape)
                             : memory::allocate_host(request.shape, request.dtype, host_options);
    switch (request.source) {
      case Source::kZeros:
        host.zero_();
        break;
      case Source::kHostCopy:
        host.copy_(request.from);
        break;
      case Source::kDeviceCopy:
        try {
          engine_->copy(CopyLane::kDeviceToHost, host, request.from);
        } catch (...) {
          engine_->drain();
          throw;
        }
        downloads = true;
        break;
    }
    hosts.push_back(std::move(host));
  }
  if (downloads) {
    // Blocking here (construction, a first step, a load, the step after a failed download)
    // is what lets a failed download leave the states where they were.
    if (const std::exception_ptr failure = engine_->drain()) std::rethrow_exception(failure);
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    *requests[i].holder = hosts[i];
    fresh->index[{requests[i].param, requests[i].slot}] = fresh->entries.size();
    fresh->entries.push_back({requests[i].param, requests[i].slot, hosts[i], offsets[i]});
  }
  layout_ = std::move(fresh);
  host_ready_ = CopyEvent();  // the downloads, if any, are done
}

// ------------------------------------------------------------------------ step

at::Tensor SwapOptimizer::step(torch::optim::Optimizer::LossClosure closure) {
  if (closure != nullptr) {
    throw InvalidArgument(
        "Swap optimizer does not support a closure: run the forward and backward pass, then call step().");
  }
  torch::NoGradGuard no_grad;
  // Everything that can be checked is checked before anything changes, so that no update
  // can fail on its inputs once the first one has run. The param groups are the wrapped
  // optimizer's, which may have changed since the constructor checked them.
  check_param_groups();
  auto& groups = optimizer_->param_groups();
  auto& states = optimizer_->state();
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool amsgrad = amsgrad_of(family_, groups[g].options());
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      const at::Tensor& param = params[p];
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.is_sparse()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer only supports dense Adam/AdamW gradients; parameter {} of param group {} has a sparse "
            "gradient.",
            p, g));
      }
      if (grad.scalar_type() != param.scalar_type() || grad.sizes() != param.sizes() ||
          grad.device() != param.device()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer: the gradient of parameter {} of param group {} is {} on {}, but the parameter is {} on "
            "{}.",
            p, g, describe(grad), grad.device().str(), describe(param), param.device().str()));
      }
      torch::optim::OptimizerParamState* state = detail::find_state(states, param);
      if (amsgrad && state != nullptr &&
          !detail::state_ref(family_, *state).tensors[detail::kMaxExpAvgSqSlot]->defined()) {
        throw InvalidArgument(fmt::format(
            "Swap optimizer: param group {} has amsgrad on but parameter {} has no max_exp_avg_sq state (amsgrad was "
            "enabled after its state was created).",
            g, p));
      }
    }
  }

  // First-step states, as the wrapped optimizer would create them. Those to be swapped
  // start in the host layout (zeros, or the parameter for a master weight) and never take
  // device memory between steps. If the layout cannot be built, they are removed again.
  std::vector<std::pair<const void*, int>> pending;
  std::vector<typename std::decay_t<decltype(states)>::key_type> created;
  for (auto& group : groups) {
    const bool amsgrad = amsgrad_of(family_, group.options());
    for (const at::Tensor& param : group.params()) {
      if (!param.grad().defined() || detail::find_state(states, param) != nullptr) continue;
      auto state = detail::new_param_state(family_);
      detail::ParamStateRef ref = detail::state_ref(family_, *state);
      const c10::ScalarType dtype = state_dtype(family_, param);
      for (int slot = 0; slot < detail::kSlotCount; ++slot) {
        if (ref.tensors[slot] == nullptr || (slot == detail::kMaxExpAvgSqSlot && !amsgrad)) continue;
        if (swapped_slot_[slot] && at::isFloatingType(dtype) && param.numel() >= config_.min_numel()) {
          pending.emplace_back(param.unsafeGetTensorImpl(), slot);
        } else if (slot == detail::kMasterParamSlot) {
          *ref.tensors[slot] = param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
        } else {
          *ref.tensors[slot] = at::zeros_like(param, param.options().dtype(dtype), at::MemoryFormat::Preserve);
        }
      }
      created.push_back(detail::state_key(states, param));
      states[created.back()] = std::move(state);
    }
  }
  try {
    std::vector<Unit> units = collect_units();
    ensure_host_layout(requests_for(units, pending));
  } catch (...) {
    for (const auto& key : created) states.erase(key);
    throw;
  }

  // Packed mode moves contiguous host ranges, so it carries the states of parameters
  // without a gradient along (unchanged); per-tensor mode leaves them on the host.
  std::vector<Unit> units = collect_units();
  if (!config_.packed_swap()) {
    units.erase(std::remove_if(units.begin(), units.end(), [](const Unit& u) { return !u.has_grad; }), units.end());
  }
  std::vector<int64_t> costs;
  for (const Unit& unit : units) {
    int64_t bytes = 0;
    for (const UnitSlot& slot : unit.slots) {
      if (slot.swapped) bytes += nbytes(*slot.holder);
    }
    costs.push_back(std::max<int64_t>(1, bytes));
  }
  const std::vector<int64_t> batch_sizes = partition_by_cost(costs, config_.swap_times());
  if (config_.packed_swap()) {
    run_packed(units, batch_sizes);
  } else {
    run_per_tensor(units, batch_sizes);
  }
  return {};
}

// Updates one parameter, or (on an exception) changes nothing: the update allocates
// before it writes, and step() has checked its inputs. The step count moves only once the
// update is done.
void SwapOptimizer::update_unit(Unit& unit, const std::function<at::Tensor(const UnitSlot&)>& swapped_state) {
  if (!unit.has_grad) return;
  std::vector<at::Tensor> tensors(detail::kSlotCount);
  for (const UnitSlot& slot : unit.slots) tensors[slot.slot] = slot.swapped ? swapped_state(slot) : *slot.holder;
  const auto& options = optimizer_->param_groups()[unit.group].options();
  const detail::AdamHyperParams hyper = detail::adam_hyper_params(options, family_ != Family::kAdam);
  if (update_fault_) update_fault_(unit.index);
  const int64_t step = *unit.state.step + 1;
  const at::Tensor& grad = unit.param.grad();
  if (family_ == Family::kMasterAdamW) {
    detail::master_adamw_update(unit.param, grad, tensors[detail::kMasterParamSlot], tensors[detail::kExpAvgSlot],
                                tensors[detail::kExpAvgSqSlot], tensors[detail::kMaxExpAvgSqSlot], step, hyper);
  } else {
    detail::adam_update(unit.param, grad, tensors[detail::kExpAvgSlot], tensors[detail::kExpAvgSqSlot],
                        tensors[detail::kMaxExpAvgSqSlot], step, hyper);
  }
  *unit.state.step = step;
}

// After a failure inside a pipeline: the units before `processed` (in unit order) were
// updated, none after. `downloaded(b)` tells whether batch b's states reached the host
// buffers; `redownload(b)` copies them there again and waits; `keep_on_device(b)` points
// batch b's holders at device copies of its states instead. A batch with an updated unit
// whose download did not succeed goes through the second and, if that fails too, the
// third, so that every parameter's state matches it. Then the cause is rethrown, with
// what happened.
void SwapOptimizer::recover_from_failure(std::exception_ptr cause, const std::vector<Unit>& units,
                                         const std::vector<size_t>& first_unit, size_t processed,
                                         const std::function<bool(int64_t)>& downloaded,
                                         const std::function<void(int64_t)>& redownload,
                                         const std::function<void(int64_t)>& keep_on_device) {
  // No copy may still run into the arenas or staged tensors, which are freed on return.
  engine_->drain();
  host_ready_ = CopyEvent();
  const int64_t batches = static_cast<int64_t>(first_unit.size()) - 1;
  std::vector<int64_t> redone;
  std::vector<int64_t> kept;
  for (int64_t b = 0; b < batches && first_unit[b] < processed; ++b) {
    if (downloaded(b)) continue;
    try {
      redownload(b);
      redone.push_back(b);
    } catch (...) {
      engine_->drain();
      keep_on_device(b);
      kept.push_back(b);
    }
  }

  std::string what = "an exception that is no std::exception";
  try {
    std::rethrow_exception(cause);
  } catch (const std::exception& e) {
    what = exception_message(e);
  } catch (...) {
  }
  std::string outcome;
  if (processed == units.size()) {
    outcome = "every parameter was updated";
  } else {
    const auto batch = std::upper_bound(first_unit.begin(), first_unit.end(), processed) - first_unit.begin() - 1;
    outcome = fmt::format("the update stopped in batch {} of {}: ", batch, batches);
    outcome += processed == 0
                   ? std::string("no parameter was updated")
                   : fmt::format(
                         "parameters {} to {} were updated (those with a gradient), {} to {} "
                         "were not",
                         units.front().index, units[processed - 1].index, units[processed].index, units.back().index);
  }
  if (!redone.empty()) {
    outcome += fmt::format("; the states of batch(es) {} were downloaded again", fmt::join(redone, ", "));
  }
  if (!kept.empty()) {
    outcome += fmt::format(
        "; the states of batch(es) {} could not be downloaded and stay on the device until the "
        "next step",
        fmt::join(kept, ", "));
  }
  throw Error(fmt::format("Swap optimizer step failed: {} ({}; every state matches its parameter)", what, outcome));
}

// Packed pipeline. Each batch's swapped states of one dtype form one contiguous range of
// that dtype's host buffer, moved with one copy per direction into a staging arena; batch
// b uses arena b % 2. Per batch:
//   compute waits for the upload of b; b is updated in the arena;
//   the download lane waits for that compute, then downloads b;
//   the upload lane waits for that download, then uploads b + 2 into the same arena.
// So at most two batches are on the device, and batch b's compute overlaps the download
// of b - 1 and the upload of b + 1. If a download fails, the upload lane fails on waiting
// for it, so the arena keeps the batch's updated states for recover_from_failure.
void SwapOptimizer::run_packed(std::vector<Unit>& units, const std::vector<int64_t>& batch_sizes) {
  const int64_t batches = static_cast<int64_t>(batch_sizes.size());
  if (batches == 0) return;
  struct Range {
    int64_t start = 0;
    int64_t end = 0;  // elements, exclusive
  };
  std::vector<std::map<c10::ScalarType, Range>> ranges(batches);
  std::vector<size_t> first_unit(batches + 1, 0);
  for (int64_t b = 0; b < batches; ++b) {
    first_unit[b + 1] = first_unit[b] + batch_sizes[b];
    for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
      for (const UnitSlot& slot : units[u].slots) {
        if (!slot.swapped) continue;
        const c10::ScalarType dtype = slot.holder->scalar_type();
        const int64_t element = slot.holder->element_size();
        auto [it, first] = ranges[b].try_emplace(dtype, Range{slot.host_offset, slot.host_offset});
        if (!first && slot.host_offset != align_up(it->second.end, detail::kAlignmentBytes / element)) {
          throw Error(
              fmt::format("Packed optimizer batch {} has a non-contiguous {} host range at state '{}' of "
                          "parameter {}.",
                          b, c10::toString(dtype), detail::slot_name(slot.slot), units[u].index));
        }
        it->second.end = slot.host_offset + slot.holder->numel();
      }
    }
  }

  // Arena layout: dtypes by name, each range 512-byte aligned and as large as the largest
  // batch's range of that dtype.
  std::map<std::string, c10::ScalarType> dtypes_by_name;
  for (const auto& batch : ranges) {
    for (const auto& [dtype, range] : batch) dtypes_by_name[c10::toString(dtype)] = dtype;
  }
  std::map<c10::ScalarType, int64_t> arena_offset;  // bytes
  int64_t arena_bytes = 0;
  for (const auto& [name, dtype] : dtypes_by_name) {
    int64_t largest = 0;
    for (const auto& batch : ranges) {
      if (const auto it = batch.find(dtype); it != batch.end()) {
        largest = std::max(largest, (it->second.end - it->second.start) * int64_t(c10::elementSize(dtype)));
      }
    }
    arena_offset[dtype] = align_up(arena_bytes, detail::kAlignmentBytes);
    arena_bytes = arena_offset[dtype] + largest;
  }
  const int arena_count = batches > 1 ? 2 : 1;
  std::vector<at::Tensor> arenas;
  for (int a = 0; a < arena_count && arena_bytes > 0; ++a) {
    arenas.push_back(at::empty({arena_bytes}, at::TensorOptions().dtype(at::kByte).device(device_)));
  }
  auto arena_view = [&](int64_t b, c10::ScalarType dtype) {
    const Range& range = ranges[b].at(dtype);
    const int64_t bytes = (range.end - range.start) * int64_t(c10::elementSize(dtype));
    return arenas[b % 2].narrow(0, arena_offset.at(dtype), bytes).view(dtype);
  };
  auto host_range = [&](int64_t b, c10::ScalarType dtype) {
    const Range& range = ranges[b].at(dtype);
    return layout_->buffers.at(dtype).narrow(0, range.start, range.end - range.start);
  };
  auto state_view = [&](int64_t b, const UnitSlot& slot) {
    const c10::ScalarType dtype = slot.holder->scalar_type();
    return arena_view(b, dtype)
        .narrow(0, slot.host_offset - ranges[b].at(dtype).start, slot.holder->numel())
        .view(slot.holder->sizes());
  };

  std::vector<CopyEvent> uploaded(batches);
  // Per batch and dtype: the download out of the arena, once enqueued.
  std::vector<std::map<c10::ScalarType, CopyEvent>> downloaded(batches);
  // Per arena and dtype: the last download out of that range, which an upload into it waits for.
  std::vector<std::map<c10::ScalarType, CopyEvent>> arena_free(arena_count);
  size_t processed = 0;  // the units before this one are updated
  try {
    engine_->wait(CopyLane::kHostToDevice, host_ready_);  // the host buffers hold the previous step's downloads
    engine_->wait(CopyLane::kHostToDevice, engine_->record_compute());  // the arenas were allocated on the compute side
    auto upload = [&](int64_t b) {
      for (const auto& [dtype, range] : ranges[b]) {
        engine_->wait(CopyLane::kHostToDevice, arena_free[b % 2][dtype]);
        engine_->copy(CopyLane::kHostToDevice, arena_view(b, dtype), host_range(b, dtype));
      }
      uploaded[b] = engine_->record(CopyLane::kHostToDevice);
    };

    upload(0);
    if (batches > 1) upload(1);
    for (int64_t b = 0; b < batches; ++b) {
      engine_->wait_compute(uploaded[b]);
      for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
        update_unit(units[u], [&](const UnitSlot& slot) { return state_view(b, slot); });
        processed = u + 1;
      }
      engine_->wait(CopyLane::kDeviceToHost, engine_->record_compute());
      for (const auto& [dtype, range] : ranges[b]) {
        engine_->copy(CopyLane::kDeviceToHost, host_range(b, dtype), arena_view(b, dtype));
        downloaded[b][dtype] = arena_free[b % 2][dtype] = engine_->record(CopyLane::kDeviceToHost);
      }
      if (b + 2 < batches) upload(b + 2);
    }
    host_ready_ = engine_->record(CopyLane::kDeviceToHost);
    // The arenas are released when this returns, so the compute side waits for the last
    // download out of them. On a device with streams this is a stream wait; on the CPU it
    // blocks, and step() returns with every state on the host.
    engine_->wait_compute(host_ready_);
  } catch (...) {
    recover_from_failure(
        std::current_exception(), units, first_unit, processed,
        [&](int64_t b) {
          for (const auto& [dtype, range] : ranges[b]) {
            const auto it = downloaded[b].find(dtype);
            if (it == downloaded[b].end()) return false;
            try {
              engine_->synchronize(it->second);
            } catch (...) {
              return false;
            }
          }
          return true;
        },
        [&](int64_t b) {
          for (const auto& [dtype, range] : ranges[b]) {
            engine_->copy(CopyLane::kDeviceToHost, host_range(b, dtype), arena_view(b, dtype));
          }
          engine_->synchronize(engine_->record(CopyLane::kDeviceToHost));
        },
        [&](int64_t b) {
          for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
            for (const UnitSlot& slot : units[u].slots) {
              if (slot.swapped) *slot.holder = state_view(b, slot).clone();
            }
          }
        });
  }
}

// Per-tensor pipeline: each swapped state gets its own device tensor for the batch, with
// one copy per state per direction. Batch b is released (after its download) before batch
// b + 2 is allocated, so at most two batches are on the device; the upload of b + 2 runs
// alongside the download of b + 1.
void SwapOptimizer::run_per_tensor(std::vector<Unit>& units, const std::vector<int64_t>& batch_sizes) {
  const int64_t batches = static_cast<int64_t>(batch_sizes.size());
  if (batches == 0) return;
  std::vector<size_t> first_unit(batches + 1, 0);
  for (int64_t b = 0; b < batches; ++b) first_unit[b + 1] = first_unit[b] + batch_sizes[b];

  // staged[b][u - first_unit[b]][slot]: the device tensor of a swapped state.
  std::vector<std::vector<std::vector<at::Tensor>>> staged(batches);
  std::vector<CopyEvent> uploaded(batches);
  std::vector<c10::optional<CopyEvent>> downloaded(batches);  // once enqueued
  auto download = [&](int64_t b) {
    for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
      for (const UnitSlot& slot : units[u].slots) {
        if (slot.swapped) {
          engine_->copy(CopyLane::kDeviceToHost, *slot.holder, staged[b][u - first_unit[b]][slot.slot]);
        }
      }
    }
    return engine_->record(CopyLane::kDeviceToHost);
  };
  size_t processed = 0;  // the units before this one are updated
  try {
    engine_->wait(CopyLane::kHostToDevice, host_ready_);  // the host buffers hold the previous step's downloads
    auto upload = [&](int64_t b) {
      staged[b].resize(batch_sizes[b]);
      for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
        auto& tensors = staged[b][u - first_unit[b]];
        tensors.resize(detail::kSlotCount);
        for (const UnitSlot& slot : units[u].slots) {
          if (slot.swapped) tensors[slot.slot] = at::empty_like(*slot.holder, slot.holder->options().device(device_));
        }
      }
      engine_->wait(CopyLane::kHostToDevice, engine_->record_compute());  // allocated on the compute side
      for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
        for (const UnitSlot& slot : units[u].slots) {
          if (slot.swapped) {
            engine_->copy(CopyLane::kHostToDevice, staged[b][u - first_unit[b]][slot.slot], *slot.holder);
          }
        }
      }
      uploaded[b] = engine_->record(CopyLane::kHostToDevice);
    };

    upload(0);
    if (batches > 1) upload(1);
    for (int64_t b = 0; b < batches; ++b) {
      engine_->wait_compute(uploaded[b]);
      for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
        update_unit(units[u], [&](const UnitSlot& slot) { return staged[b][u - first_unit[b]][slot.slot]; });
        processed = u + 1;
      }
      engine_->wait(CopyLane::kDeviceToHost, engine_->record_compute());
      downloaded[b] = download(b);
      if (b >= 1) {
        engine_->wait_compute(*downloaded[b - 1]);  // a stream wait, or on the CPU a block
        staged[b - 1].clear();
        if (b + 1 < batches) upload(b + 1);
      }
    }
    host_ready_ = *downloaded[batches - 1];
    engine_->wait_compute(host_ready_);  // as in run_packed: the staged tensors are released on return
  } catch (...) {
    // A batch whose staged tensors are gone was downloaded (its download was waited for).
    recover_from_failure(
        std::current_exception(), units, first_unit, processed,
        [&](int64_t b) {
          if (staged[b].empty()) return true;
          if (!downloaded[b]) return false;
          try {
            engine_->synchronize(*downloaded[b]);
          } catch (...) {
            return false;
          }
          return true;
        },
        [&](int64_t b) { engine_->synchronize(download(b)); },
        [&](int64_t b) {
          for (size_t u = first_unit[b]; u < first_unit[b + 1]; ++u) {
            for (const UnitSlot& slot : units[u].slots) {
              if (slot.swapped) *slot.holder = staged[b][u - first_unit[b]][slot.slot];
            }
          }
        });
  }
}

namespace detail {

void set_update_fault_injector(SwapOptimizer& optimizer, std::function<void(int64_t param_index)> injector) {
  optimizer.update_fault_ = std::move(injector);
}

}  // namespace detail

}  // namespace stowage::optim
