#include "optim/host_update.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include "util/exception_message.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

namespace stowage::optim::detail {

using memory::CopyEvent;
using memory::CopyLane;

namespace {

bool mirror_matches(const at::Tensor& param, int64_t version, const void* data) {
  return param._version() == version && param.data_ptr() == data;
}

}  // namespace

std::vector<at::Tensor> host_share(const std::vector<torch::optim::OptimizerParamGroup>& groups, double fraction,
                                   int64_t min_numel) {
  int64_t total = 0;
  for (const auto& group : groups) {
    for (const at::Tensor& param : group.params()) total += static_cast<int64_t>(param.nbytes());
  }
  std::vector<at::Tensor> share;
  int64_t before = 0;
  for (const auto& group : groups) {
    for (const at::Tensor& param : group.params()) {
      if (static_cast<double>(before) >= fraction * static_cast<double>(total)) return share;
      before += static_cast<int64_t>(param.nbytes());
      if (at::isFloatingType(param.scalar_type()) && param.numel() >= min_numel) share.push_back(param);
    }
  }
  return share;
}

std::vector<Unit> take_host_units(std::vector<Unit>& units, const std::vector<at::Tensor>& share) {
  std::unordered_set<const c10::TensorImpl*> chosen;
  for (const at::Tensor& param : share) chosen.insert(param.unsafeGetTensorImpl());
  std::vector<Unit> on_host;
  std::vector<Unit> on_device;
  for (Unit& unit : units) {
    const bool states_on_host = std::all_of(unit.state.tensors.begin(), unit.state.tensors.end(),
                                            [](const StateTensor& t) { return t.swapped || !t.holder->defined(); });
    const bool to_host = chosen.count(unit.param.unsafeGetTensorImpl()) != 0 && states_on_host;
    (to_host ? on_host : on_device).push_back(std::move(unit));
  }
  units = std::move(on_device);
  return on_host;
}

HostUpdate::HostUpdate(memory::CopyEngine& engine, bool offload_in_backward)
    : engine_(engine), offload_in_backward_(offload_in_backward) {
  if (!engine_.device().is_cpu()) gradients_ = std::make_unique<HostGradients>(engine);
}

void HostUpdate::watch(const std::vector<at::Tensor>& share) {
  if (gradients_) gradients_->watch(offload_in_backward_ ? share : std::vector<at::Tensor>{});
}

bool HostUpdate::has_gradient(const at::Tensor& param) const {
  return param.grad().defined() || (gradients_ && gradients_->holds(param));
}

void HostUpdate::restore_gradient(const at::Tensor& param) {
  if (gradients_) gradients_->restore_to_device(param);
}

void HostUpdate::discard_gradients() {
  if (gradients_) gradients_->clear();
}

void HostUpdate::run(std::vector<Unit>& units, const HostUnitUpdate& update) {
  if (!gradients_) {
    for (Unit& unit : units) {
      if (unit.has_grad) update(unit, unit.param, unit.param.grad());
    }
    return;
  }
  // Mirrors of parameters no longer updated here (freed, or moved to the device's share).
  std::unordered_set<const c10::TensorImpl*> current;
  for (const Unit& unit : units) current.insert(unit.param.unsafeGetTensorImpl());
  for (auto it = mirrors_.begin(); it != mirrors_.end();) {
    it = current.count(it->first) != 0 || it->second.ahead ? std::next(it) : mirrors_.erase(it);
  }
  try {
    upload_ahead(units);
    run_on_device(units, update);
  } catch (const std::exception& e) {
    engine_.drain();  // no copy runs on the mirrors once this returns
    throw Error(fmt::format(
        "Swap optimizer's update on the host failed: {} (the parameters updated on the host but not yet on the "
        "device are uploaded first by the next step)",
        exception_message(e)));
  }
  gradients_->clear();
}

HostUpdate::Mirror& HostUpdate::mirror_of(const Unit& unit) {
  Mirror& mirror = mirrors_[unit.param.unsafeGetTensorImpl()];
  if (!mirror.param.defined() || mirror.param.sizes() != unit.param.sizes() ||
      mirror.param.scalar_type() != unit.param.scalar_type()) {
    mirror = Mirror();
    mirror.param = pinned_host_like(unit.param, engine_.device().type());
  }
  return mirror;
}

void HostUpdate::upload_ahead(const std::vector<Unit>& units) {
  bool any = false;
  for (const Unit& unit : units) {
    const auto found = mirrors_.find(unit.param.unsafeGetTensorImpl());
    if (found == mirrors_.end() || !found->second.ahead) continue;
    if (!any) engine_.wait(CopyLane::kHostToDevice, engine_.record_compute());  // the backward read the parameter
    engine_.copy(CopyLane::kHostToDevice, unit.param.detach(), found->second.param);
    any = true;
  }
  if (!any) return;
  engine_.synchronize(engine_.record(CopyLane::kHostToDevice));
  for (const Unit& unit : units) {
    const auto found = mirrors_.find(unit.param.unsafeGetTensorImpl());
    if (found == mirrors_.end() || !found->second.ahead) continue;
    found->second.matches(unit.param);
  }
}

// The held gradient, the one downloaded at run(), or their sum (in the mirror: the held
// one stays as it was, for a run() that fails and is tried again).
at::Tensor HostUpdate::gradient_of(const at::Tensor& param, Mirror& mirror) {
  const bool on_device = param.grad().defined();
  if (!gradients_->holds(param)) return mirror.grad;
  const at::Tensor held = gradients_->take(param);
  return on_device ? mirror.grad.add_(held) : held;
}

void HostUpdate::run_on_device(std::vector<Unit>& units, const HostUnitUpdate& update) {
  // The gradients left on the device are the backward's, and the parameters it read are
  // overwritten below.
  const CopyEvent backward_done = engine_.record_compute();
  engine_.wait(CopyLane::kDeviceToHost, backward_done);
  engine_.wait(CopyLane::kHostToDevice, backward_done);
  std::vector<Mirror*> mirrors(units.size(), nullptr);
  std::vector<CopyEvent> downloaded(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u].has_grad) continue;
    Mirror& mirror = *(mirrors[u] = &mirror_of(units[u]));
    const at::Tensor& param = units[u].param;
    if (!mirror_matches(param, mirror.version, mirror.data)) {
      engine_.copy(CopyLane::kDeviceToHost, mirror.param, param.detach());
      mirror.version = -1;  // valid once the copy is known to have run
    }
    if (param.grad().defined()) {
      if (!mirror.grad.defined()) mirror.grad = pinned_host_like(param, engine_.device().type());
      engine_.copy(CopyLane::kDeviceToHost, mirror.grad, param.grad().detach());
    }
    downloaded[u] = engine_.record(CopyLane::kDeviceToHost);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (mirrors[u] == nullptr) continue;
    engine_.synchronize(downloaded[u]);
    update(units[u], mirrors[u]->param, gradient_of(units[u].param, *mirrors[u]));
    mirrors[u]->ahead = true;
    engine_.copy(CopyLane::kHostToDevice, units[u].param.detach(), mirrors[u]->param);
  }
  // The next forward reads the parameters, and the mirrors' versions are the ones the
  // uploads leave.
  engine_.synchronize(engine_.record(CopyLane::kHostToDevice));
  for (size_t u = 0; u < units.size(); ++u) {
    if (mirrors[u] != nullptr) mirrors[u]->matches(units[u].param);
  }
}

}  // namespace stowage::optim::detail
