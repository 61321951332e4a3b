#include "sim/hooks.h"

#include "sim/generator.h"
#include "sim/pinned_memory.h"
#include "sim/runtime.h"

#include <c10/util/Exception.h>

namespace stowage::sim::detail {

bool SimHooks::hasPrimaryContext(c10::DeviceIndex device_index) const {
  return device_index >= 0 && device_index < device_count();
}

c10::DeviceIndex SimHooks::deviceCount() const {
  return device_count();
}

void SimHooks::setCurrentDevice(c10::DeviceIndex device) const {
  set_current_device(device);
}

c10::DeviceIndex SimHooks::getCurrentDevice() const {
  return current_device();
}

c10::DeviceIndex SimHooks::exchangeDevice(c10::DeviceIndex device) const {
  const c10::DeviceIndex previous = current_device();
  set_current_device(device);
  return previous;
}

c10::DeviceIndex SimHooks::maybeExchangeDevice(c10::DeviceIndex device) const {
  return device >= 0 && device < device_count() ? exchangeDevice(device) : current_device();
}

bool SimHooks::isPinnedPtr(const void* data) const {
  return has_pinned_memory() && PinnedMemory::instance().contains(data);
}

at::Allocator* SimHooks::getPinnedMemoryAllocator() const {
  TORCH_CHECK(has_pinned_memory(),
              "sim: this simulated device has no pinned host memory (STOWAGE_SIM_PINNED_MEMORY=0)");
  return &PinnedMemory::instance();
}

const at::Generator& SimHooks::getDefaultGenerator(c10::DeviceIndex device_index) const {
  return default_generator(device_index < 0 ? current_device() : device_index);
}

at::Generator SimHooks::getNewGenerator(c10::DeviceIndex device_index) const {
  const c10::DeviceIndex device = device_index < 0 ? current_device() : device_index;
  check_index(device);
  return at::make_generator<SimGenerator>(device);
}

}  // namespace stowage::sim::detail
