#pragma once

// The simulated device's c10::impl::DeviceGuardImplInterface: current device and stream,
// streams, events. An event is a Marker recorded on a stream; recording it again replaces
// the marker, as re-recording a CUDA event does.

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace stowage::sim::detail {

class SimGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device device) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device device) const override;
  void uncheckedSetDevice(c10::Device device) const noexcept override;
  c10::DeviceIndex deviceCount() const noexcept override;

  c10::Stream getStream(c10::Device device) const override;
  c10::Stream getDefaultStream(c10::Device device) const override;
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool is_high_priority = false) const override;
  c10::Stream getNewStream(c10::Device device, int priority = 0) const override;
  c10::Stream exchangeStream(c10::Stream stream) const override;
  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;
  void synchronizeDevice(c10::DeviceIndex device_index) const override;
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override;

  void record(void** event, const c10::Stream& stream, c10::DeviceIndex device_index,
              c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void synchronizeEvent(void* event) const override;
  double elapsedTime(void* start, void* end, c10::DeviceIndex device_index) const override;
  void destroyEvent(void* event, c10::DeviceIndex device_index) const noexcept override;
};

}  // namespace stowage::sim::detail
