#include <stowage/sim/sim.h>

#include "sim/device_memory.h"
#include "sim/guard.h"
#include "sim/hazards.h"
#include "sim/hooks.h"
#include "sim/operators.h"
#include "sim/pinned_memory.h"
#include "sim/runtime.h"
#include "sim/stream_queue.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/DeviceType.h>
#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

namespace stowage::sim {
namespace {

void require_registered() {
  if (!detail::configured()) {
    throw Error("sim: the simulated device is not registered; call stowage::sim::register_device() first");
  }
}

// `options` with what the environment overrides.
SimOptions from_environment(SimOptions options) {
  if (const char* capacity = std::getenv("STOWAGE_SIM_CAPACITY")) {
    options.capacity_bytes = parse_capacity(capacity, "STOWAGE_SIM_CAPACITY");
  }
  if (const char* devices = std::getenv("STOWAGE_SIM_DEVICES")) {
    char* end = nullptr;
    const long count = std::strtol(devices, &end, 10);
    if (end == devices || *end != '\0' || count < 1 || count > detail::kMaxDevices) {
      throw InvalidArgument(fmt::format("sim: STOWAGE_SIM_DEVICES='{}' is not a number of devices in [1, {}]", devices,
                                        detail::kMaxDevices));
    }
    options.devices = static_cast<int>(count);
  }
  if (const char* pinned = std::getenv("STOWAGE_SIM_PINNED_MEMORY")) {
    const std::string value = pinned;
    if (value != "0" && value != "1") {
      throw InvalidArgument(fmt::format("sim: STOWAGE_SIM_PINNED_MEMORY='{}' is neither 1 nor 0", value));
    }
    options.pinned_memory = value == "1";
  }
  return options;
}

void register_once(const SimOptions& options) {
  if (c10::is_privateuse1_backend_registered() && c10::get_privateuse1_backend() != "sim") {
    throw Error(fmt::format("sim: this process already registered another PrivateUse1 device, '{}'",
                            c10::get_privateuse1_backend()));
  }
  const SimOptions configured = from_environment(options);
  detail::configure(configured);
  c10::register_privateuse1_backend("sim");
  static const c10::impl::DeviceGuardImplRegistrar guard(c10::DeviceType::PrivateUse1, new detail::SimGuard());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &detail::DeviceMemory::instance());
  if (configured.pinned_memory) at::setHostAllocator(c10::DeviceType::PrivateUse1, &detail::PinnedMemory::instance());
  at::RegisterPrivateUse1HooksInterface(new detail::SimHooks());
  detail::register_operators();
}

}  // namespace

void register_device(const SimOptions& options) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (!detail::configured()) register_once(options);
}

c10::DeviceType device_type() {
  require_registered();
  return c10::DeviceType::PrivateUse1;
}

int device_count() {
  require_registered();
  return detail::device_count();
}

c10::Device device(int index) {
  require_registered();
  detail::check_index(static_cast<c10::DeviceIndex>(index));
  return detail::sim_device(static_cast<c10::DeviceIndex>(index));
}

void set_capacity(int64_t bytes, int index) {
  require_registered();
  detail::set_capacity_of(static_cast<c10::DeviceIndex>(index), bytes);
}

int64_t capacity(int index) {
  require_registered();
  detail::check_index(static_cast<c10::DeviceIndex>(index));
  return detail::capacity_of(static_cast<c10::DeviceIndex>(index));
}

void set_copy_delay(int64_t min_us, int64_t max_us) {
  detail::set_copy_delay_range(min_us, max_us);
}

CopyGate::CopyGate() {
  detail::close_copy_gate();
}

CopyGate::~CopyGate() {
  open();
}

void CopyGate::open() {
  if (open_) return;
  open_ = true;
  detail::open_copy_gate();
}

int64_t parse_capacity(const std::string& text, const std::string& what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "KiB") shift = 10;
  if (unit == "MiB") shift = 20;
  if (unit == "GiB") shift = 30;
  const auto invalid = [&] {
    return InvalidArgument(fmt::format(
        "sim: {}='{}' is not a capacity: expected a positive number of bytes, optionally followed by KiB, MiB or GiB",
        what, text));
  };
  if (digits == 0 || digits > 18 || shift < 0) throw invalid();
  const int64_t count = std::stoll(text.substr(0, digits));
  if (count <= 0 || count > (std::numeric_limits<int64_t>::max() >> shift)) throw invalid();
  return count << shift;
}

std::vector<std::string> hazards() {
  return detail::listed_hazards();
}

void clear_hazards() {
  detail::clear_listed_hazards();
}

void synchronize_all() {
  require_registered();
  for (c10::DeviceIndex index = 0; index < detail::device_count(); ++index) detail::synchronize_device(index);
}

}  // namespace stowage::sim
