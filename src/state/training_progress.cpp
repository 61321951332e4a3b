#include <stowage/error.h>
#include <stowage/state/training_progress.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <fmt/format.h>

#include <string>
#include <utility>

namespace stowage {
namespace {

at::Generator default_cpu_generator() {
  return at::detail::getDefaultCPUGenerator();  // a handle: set_state is non-const
}

// Checks that `state` holds at `key` a generator state like `live`'s.
void check_generator_state(const StateDict& state, const char* key, const at::Tensor& live) {
  if (!state.contains(key) || !state.at(key).isTensor()) {
    throw InvalidArgument(fmt::format("TrainingProgress: the state has no tensor '{}'", key));
  }
  const at::Tensor saved = state.at(key).toTensor();
  if (saved.scalar_type() != live.scalar_type() || !saved.sizes().equals(live.sizes())) {
    throw InvalidArgument(fmt::format(
        "TrainingProgress: '{}' is a {} tensor of {} elements, not a generator "
        "state of this LibTorch ({} of {})",
        key, c10::toString(saved.scalar_type()), saved.numel(), c10::toString(live.scalar_type()), live.numel()));
  }
}

}  // namespace

TrainingProgress::TrainingProgress(at::Generator data, const std::vector<c10::Device>& devices)
    : data_(std::move(data)) {
  if (!data_.defined() || data_.device().type() != c10::DeviceType::CPU) {
    throw InvalidArgument("TrainingProgress: the data generator must be a CPU generator");
  }
  for (const c10::Device& device : devices) {
    if (device.is_cpu()) continue;
    const std::string key = "device_rng_" + c10::DeviceTypeName(device.type(), /*lower_case=*/true);
    for (const DeviceGenerator& kept : devices_) {
      if (kept.key == key) {
        throw InvalidArgument(fmt::format(
            "TrainingProgress: two devices of type {} ({}, and another); a process keeps one device of a type",
            c10::DeviceTypeName(device.type(), true), device.str()));
      }
    }
    devices_.push_back({key, at::globalContext().defaultGenerator(device)});
  }
}

StateDict TrainingProgress::state_dict() {
  StateDict state;
  state.insert("step", step_);
  state.insert("data_rng", data_.get_state());
  state.insert("torch_rng", default_cpu_generator().get_state());
  for (const DeviceGenerator& device : devices_) state.insert(device.key, device.generator.get_state());
  return state;
}

void TrainingProgress::check_load_state_dict(const StateDict& state) {
  if (!state.contains("step") || !state.at("step").isInt()) {
    throw InvalidArgument("TrainingProgress: the state has no integer 'step'");
  }
  check_generator_state(state, "data_rng", data_.get_state());
  check_generator_state(state, "torch_rng", default_cpu_generator().get_state());
  for (const DeviceGenerator& device : devices_) {
    if (state.contains(device.key)) check_generator_state(state, device.key.c_str(), device.generator.get_state());
  }
}

void TrainingProgress::load_state_dict(const StateDict& state) {
  check_load_state_dict(state);
  data_.set_state(state.at("data_rng").toTensor());
  default_cpu_generator().set_state(state.at("torch_rng").toTensor());
  for (DeviceGenerator& device : devices_) {
    if (state.contains(device.key)) {
      device.generator.set_state(state.at(device.key).toTensor());
    } else {
      TORCH_WARN("TrainingProgress: the state keeps no '", device.key,
                 "' (saved before the device's generator was kept, or on another device): that generator goes on "
                 "as it is, so what draws from it (dropout on the device) is not what an uninterrupted run drew");
    }
  }
  step_ = state.at("step").toInt();
}

}  // namespace stowage
