#include "sim/generator.h"

#include "sim/runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/DispatchKeySet.h>

#include <mutex>
#include <vector>

namespace stowage::sim::detail {

SimGenerator::SimGenerator(c10::DeviceIndex device)
    : c10::GeneratorImpl(sim_device(device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom())) {
  cpu_.set_current_seed(c10::default_rng_seed_val);
}

// Each call locks the CPU generator too: a kernel may be drawing from it on another thread.
void SimGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_current_seed(seed);
}

void SimGenerator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.set_offset(offset);
}

uint64_t SimGenerator::get_offset() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.get_offset();
}

uint64_t SimGenerator::current_seed() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.current_seed();
}

uint64_t SimGenerator::seed() {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.seed();
}

void SimGenerator::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> SimGenerator::get_state() const {
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  return cpu_.unsafeGetGeneratorImpl()->get_state();
}

SimGenerator* SimGenerator::clone_impl() const {
  auto* copy = new SimGenerator(device().index());
  std::lock_guard<std::mutex> lock(cpu_.mutex());
  copy->cpu_ = cpu_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static const auto* generators = [] {
    auto* all = new std::vector<at::Generator>();
    for (c10::DeviceIndex index = 0; index < device_count(); ++index) {
      all->push_back(at::make_generator<SimGenerator>(index));
    }
    return all;
  }();
  check_index(device);
  return (*generators)[static_cast<size_t>(device)];
}

}  // namespace stowage::sim::detail
