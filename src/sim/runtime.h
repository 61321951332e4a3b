#pragma once

// The simulator's configuration and per-thread device selection. Everything here is
// fixed by register_device() except the capacities and copy delays, which tests change.

#include <stowage/sim/sim.h>

#include <c10/core/Device.h>

#include <cstdint>

namespace stowage::sim::detail {

constexpr int kMaxDevices = 16;

// REQUIRES: configure() ran once, before any other call below.
void configure(const SimOptions& options);
bool configured();

c10::DeviceIndex device_count();
bool has_pinned_memory();
// Throws InvalidArgument naming the index unless 0 <= index < device_count().
void check_index(c10::DeviceIndex index);

// The calling thread's current device index (0 until set).
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

int64_t capacity_of(c10::DeviceIndex index);
void set_capacity_of(c10::DeviceIndex index, int64_t bytes);

// A delay for the next queued copy, drawn from the configured range.
int64_t draw_copy_delay_us();
void set_copy_delay_range(int64_t min_us, int64_t max_us);

inline c10::Device sim_device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

}  // namespace stowage::sim::detail
