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

at::Tensor mirror_tensor_like(const at::Tensor& tensor, c10::DeviceType device_type) {
  memory::HostAllocOptions options;
  options.pin_memory = true;  // where the device can pin; plain memory otherwise
  options.pin_for = device_type;
  options.use = memory::HostBufferUse::kOptimizer;
  return memory::allocate_host(tensor.sizes(), tensor.scalar_type(), options);
}

bool mirror_matches(const at::Tensor& param, int64_t version, const void* data) {
  return param._version() == version && param.data_ptr() == data;
}

}  // namespace

std::vector<Unit> take_host_units(std::vector<Unit>& units,
                                  const std::vector<torch::optim::OptimizerParamGroup>& groups, double fraction) {
  int64_t total = 0;
  for (const auto& group : groups) {
    for (const at::Tensor& param : group.params()) total += static_cast<int64_t>(param.nbytes());
  }
  std::unordered_set<const c10::TensorImpl*> share;
  int64_t before = 0;
  for (const auto& group : groups) {
    for (const at::Tensor& param : group.params()) {
      if (static_cast<double>(before) >= fraction * static_cast<double>(total)) break;
      share.insert(param.unsafeGetTensorImpl());
      before += static_cast<int64_t>(param.nbytes());
    }
  }
  std::vector<Unit> on_host;
  std::vector<Unit> on_device;
  for (Unit& unit : units) {
    const bool states_on_host = std::all_of(unit.state.tensors.begin(), unit.state.tensors.end(),
                                            [](const StateTensor& t) { return t.swapped || !t.holder->defined(); });
    const bool chosen = share.count(unit.param.unsafeGetTensorImpl()) != 0 && states_on_host;
    (chosen ? on_host : on_device).push_back(std::move(unit));
  }
  units = std::move(on_device);
  return on_host;
}

void HostUpdate::run(memory::CopyEngine& engine, std::vector<Unit>& units, const HostUnitUpdate& update) {
  if (engine.device().is_cpu()) {
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
    upload_ahead(engine, units);
    run_on_device(engine, units, update);
  } catch (const std::exception& e) {
    engine.drain();  // no copy runs on the mirrors once this returns
    throw Error(fmt::format(
        "Swap optimizer's update on the host failed: {} (the parameters updated on the host but not yet on the "
        "device are uploaded first by the next step)",
        exception_message(e)));
  }
}

HostUpdate::Mirror& HostUpdate::mirror_of(memory::CopyEngine& engine, const Unit& unit) {
  Mirror& mirror = mirrors_[unit.param.unsafeGetTensorImpl()];
  const c10::DeviceType device_type = engine.device().type();
  if (!mirror.param.defined() || mirror.param.sizes() != unit.param.sizes() ||
      mirror.param.scalar_type() != unit.param.scalar_type()) {
    mirror = Mirror{mirror_tensor_like(unit.param, device_type), mirror_tensor_like(unit.param.grad(), device_type)};
  }
  return mirror;
}

void HostUpdate::upload_ahead(memory::CopyEngine& engine, const std::vector<Unit>& units) {
  bool any = false;
  for (const Unit& unit : units) {
    const auto found = mirrors_.find(unit.param.unsafeGetTensorImpl());
    if (found == mirrors_.end() || !found->second.ahead) continue;
    if (!any) engine.wait(CopyLane::kHostToDevice, engine.record_compute());  // the backward read the parameter
    engine.copy(CopyLane::kHostToDevice, unit.param.detach(), found->second.param);
    any = true;
  }
  if (!any) return;
  engine.synchronize(engine.record(CopyLane::kHostToDevice));
  for (const Unit& unit : units) {
    const auto found = mirrors_.find(unit.param.unsafeGetTensorImpl());
    if (found == mirrors_.end() || !found->second.ahead) continue;
    found->second.matches(unit.param);
  }
}

void HostUpdate::run_on_device(memory::CopyEngine& engine, std::vector<Unit>& units, const HostUnitUpdate& update) {
  // The gradients are the backward's, and the parameters it read are overwritten below.
  const CopyEvent backward_done = engine.record_compute();
  engine.wait(CopyLane::kDeviceToHost, backward_done);
  engine.wait(CopyLane::kHostToDevice, backward_done);
  std::vector<Mirror*> mirrors(units.size(), nullptr);
  std::vector<CopyEvent> downloaded(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u].has_grad) continue;
    Mirror& mirror = *(mirrors[u] = &mirror_of(engine, units[u]));
    const at::Tensor& param = units[u].param;
    if (!mirror_matches(param, mirror.version, mirror.data)) {
      engine.copy(CopyLane::kDeviceToHost, mirror.param, param.detach());
      mirror.version = -1;  // valid once the copy is known to have run
    }
    engine.copy(CopyLane::kDeviceToHost, mirror.grad, param.grad());
    downloaded[u] = engine.record(CopyLane::kDeviceToHost);
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (mirrors[u] == nullptr) continue;
    engine.synchronize(downloaded[u]);
    update(units[u], mirrors[u]->param, mirrors[u]->grad);
    mirrors[u]->ahead = true;
    engine.copy(CopyLane::kHostToDevice, units[u].param.detach(), mirrors[u]->param);
  }
  // The next forward reads the parameters, and the mirrors' versions are the ones the
  // uploads leave.
  engine.synchronize(engine.record(CopyLane::kHostToDevice));
  for (size_t u = 0; u < units.size(); ++u) {
    if (mirrors[u] != nullptr) mirrors[u]->matches(units[u].param);
  }
}

}  // namespace stowage::optim::detail
