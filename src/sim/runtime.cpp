#include "sim/runtime.h"

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <random>

namespace stowage::sim::detail {
namespace {

std::atomic<bool> g_configured{false};
c10::DeviceIndex g_device_count = 0;
bool g_pinned_memory = true;
std::array<std::atomic<int64_t>, kMaxDevices> g_capacity{};
std::atomic<int64_t> g_delay_min_us{0};
std::atomic<int64_t> g_delay_max_us{0};
thread_local c10::DeviceIndex t_current_device = 0;

void check_delay_range(int64_t min_us, int64_t max_us) {
  if (min_us < 0 || max_us < min_us) {
    throw InvalidArgument(fmt::format(
        "sim: the copy delay range must satisfy 0 <= min <= max microseconds, got [{}, {}]", min_us, max_us));
  }
}

}  // namespace

void configure(const SimOptions& options) {
  if (options.devices < 1 || options.devices > kMaxDevices) {
    throw InvalidArgument(
        fmt::format("sim: the number of devices must be in [1, {}], got {}", kMaxDevices, options.devices));
  }
  if (options.capacity_bytes <= 0) {
    throw InvalidArgument(fmt::format("sim: a device's capacity must be > 0 bytes, got {}", options.capacity_bytes));
  }
  check_delay_range(options.copy_delay_min_us, options.copy_delay_max_us);
  g_device_count = static_cast<c10::DeviceIndex>(options.devices);
  g_pinned_memory = options.pinned_memory;
  for (auto& capacity : g_capacity) capacity.store(options.capacity_bytes);
  g_delay_min_us.store(options.copy_delay_min_us);
  g_delay_max_us.store(options.copy_delay_max_us);
  g_configured.store(true);
}

bool configured() {
  return g_configured.load();
}

c10::DeviceIndex device_count() {
  return g_device_count;
}

bool has_pinned_memory() {
  return g_pinned_memory;
}

void check_index(c10::DeviceIndex index) {
  if (index < 0 || index >= g_device_count) {
    throw InvalidArgument(fmt::format("sim: there is no device sim:{}; this process has {} (sim:0 to sim:{})", index,
                                      g_device_count, g_device_count - 1));
  }
}

c10::DeviceIndex current_device() {
  return t_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  t_current_device = index;
}

int64_t capacity_of(c10::DeviceIndex index) {
  return g_capacity[static_cast<size_t>(index)].load();
}

void set_capacity_of(c10::DeviceIndex index, int64_t bytes) {
  check_index(index);
  if (bytes <= 0) {
    throw InvalidArgument(fmt::format("sim: the capacity of sim:{} must be > 0 bytes, got {}", index, bytes));
  }
  g_capacity[static_cast<size_t>(index)].store(bytes);
}

int64_t draw_copy_delay_us() {
  const int64_t low = g_delay_min_us.load();
  const int64_t high = g_delay_max_us.load();
  if (high <= low) return low;
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return std::uniform_int_distribution<int64_t>(low, high)(engine);
}

void set_copy_delay_range(int64_t min_us, int64_t max_us) {
  check_delay_range(min_us, max_us);
  g_delay_min_us.store(min_us);
  g_delay_max_us.store(max_us);
}

}  // namespace stowage::sim::detail
