#pragma once

// The simulated device's at::PrivateUse1HooksInterface: what at::globalContext() asks of
// an accelerator (pinned memory, generators, the device count and the current device).

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace stowage::sim::detail {

class SimHooks final : public at::PrivateUse1HooksInterface {
 public:
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override;
  c10::DeviceIndex deviceCount() const override;
  void setCurrentDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex getCurrentDevice() const override;
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override;
  bool isPinnedPtr(const void* data) const override;
  at::Allocator* getPinnedMemoryAllocator() const override;
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override;
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override;
};

}  // namespace stowage::sim::detail
