#include "activation/rng_state.h"

#include <stowage/activation/checkpoint.h>

#include "activation/nested_tensors.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>

namespace stowage::activation {
namespace {

void collect_devices(const c10::IValue& value, std::vector<c10::Device>& devices) {
  for_each_tensor(value, [&devices](const at::Tensor& tensor) {
    if (tensor.device().is_cpu() || tensor.device().type() == c10::kMeta) {
      return;
    }
    if (std::find(devices.begin(), devices.end(), tensor.device()) == devices.end()) {
      devices.push_back(tensor.device());
    }
  });
}

at::Tensor get_state(at::Generator& generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator& generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Generator default_generator(c10::Device device) {
  try {
    return at::globalContext().defaultGenerator(device);
  } catch (const c10::Error& e) {
    throw RecomputationError(
        fmt::format("checkpoint: cannot read the random generator of input device {} to preserve its state ({}); pass "
                    "CheckpointOptions().preserve_rng_state(false) if fn draws no random numbers there",
                    device.str(), e.what_without_backtrace()));
  }
}

}  // namespace

RngSnapshot RngSnapshot::capture(const std::vector<c10::IValue>& values) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  for (const c10::IValue& value : values) {
    collect_devices(value, devices);
  }
  RngSnapshot snapshot;
  for (const c10::Device& device : devices) {
    at::Generator generator = default_generator(device);
    at::Tensor state = get_state(generator);
    snapshot.states_.emplace_back(std::move(generator), std::move(state));
  }
  return snapshot;
}

RngReplay::RngReplay(const RngSnapshot& snapshot) {
  for (auto [generator, state] : snapshot.states_) {
    saved_.states_.emplace_back(generator, get_state(generator));
  }
  for (auto [generator, state] : snapshot.states_) {
    set_state(generator, state);
  }
}

RngReplay::~RngReplay() {
  for (auto& [generator, state] : saved_.states_) {
    set_state(generator, state);
  }
}

}  // namespace stowage::activation
