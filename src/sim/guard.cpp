#include "sim/guard.h"

#include "sim/device_memory.h"
#include "sim/hazards.h"
#include "sim/runtime.h"
#include "sim/stream_queue.h"

#include <chrono>
#include <memory>

namespace stowage::sim::detail {
namespace {

struct SimEvent {
  std::shared_ptr<Marker> marker;  // null until recorded
};

c10::DeviceIndex index_of(c10::Device device) {
  return device.has_index() ? device.index() : current_device();
}

}  // namespace

c10::Device SimGuard::exchangeDevice(c10::Device device) const {
  const c10::Device previous = getDevice();
  setDevice(device);
  return previous;
}

c10::Device SimGuard::getDevice() const {
  return sim_device(current_device());
}

void SimGuard::setDevice(c10::Device device) const {
  set_current_device(index_of(device));
}

void SimGuard::uncheckedSetDevice(c10::Device device) const noexcept {
  try {
    set_current_device(index_of(device));
  } catch (...) {  // unchecked: an invalid index leaves the device as it was
  }
}

c10::DeviceIndex SimGuard::deviceCount() const noexcept {
  return device_count();
}

c10::Stream SimGuard::getStream(c10::Device device) const {
  return current_stream(index_of(device));
}

c10::Stream SimGuard::getDefaultStream(c10::Device device) const {
  return default_stream(index_of(device));
}

c10::Stream SimGuard::getStreamFromGlobalPool(c10::Device device, bool /*is_high_priority*/) const {
  return pool_stream(index_of(device));
}

c10::Stream SimGuard::getNewStream(c10::Device device, int /*priority*/) const {
  return new_stream(index_of(device));
}

c10::Stream SimGuard::exchangeStream(c10::Stream stream) const {
  return exchange_stream(stream);
}

bool SimGuard::queryStream(const c10::Stream& stream) const {
  return queue_of(stream).idle();
}

void SimGuard::synchronizeStream(const c10::Stream& stream) const {
  queue_of(stream).synchronize();
  throw_pending_hazard();
}

void SimGuard::synchronizeDevice(c10::DeviceIndex device_index) const {
  synchronize_device(device_index < 0 ? current_device() : device_index);
  throw_pending_hazard();
}

void SimGuard::recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const {
  DeviceMemory::instance().recordStream(data_ptr, stream);
}

void SimGuard::record(void** event, const c10::Stream& stream, c10::DeviceIndex /*device_index*/,
                      c10::EventFlag /*flag*/) const {
  if (*event == nullptr) *event = new SimEvent();
  static_cast<SimEvent*>(*event)->marker = queue_of(stream).record();
}

void SimGuard::block(void* event, const c10::Stream& stream) const {
  if (event == nullptr) return;  // never recorded: nothing to wait for
  const auto& marker = static_cast<SimEvent*>(event)->marker;
  if (marker) queue_of(stream).wait_for(marker);
}

bool SimGuard::queryEvent(void* event) const {
  if (event == nullptr) return true;
  const auto& marker = static_cast<SimEvent*>(event)->marker;
  return !marker || marker->done();
}

void SimGuard::synchronizeEvent(void* event) const {
  if (event != nullptr && static_cast<SimEvent*>(event)->marker) static_cast<SimEvent*>(event)->marker->wait();
  throw_pending_hazard();
}

double SimGuard::elapsedTime(void* start, void* end, c10::DeviceIndex /*device_index*/) const {
  TORCH_CHECK(start != nullptr && end != nullptr, "sim: elapsedTime needs two recorded events");
  auto* first = static_cast<SimEvent*>(start);
  auto* second = static_cast<SimEvent*>(end);
  TORCH_CHECK(first->marker && second->marker, "sim: elapsedTime needs two recorded events");
  first->marker->wait();
  second->marker->wait();
  const auto elapsed = second->marker->completed_at() - first->marker->completed_at();
  return std::chrono::duration<double, std::milli>(elapsed).count();
}

void SimGuard::destroyEvent(void* event, c10::DeviceIndex /*device_index*/) const noexcept {
  delete static_cast<SimEvent*>(event);
}

}  // namespace stowage::sim::detail
