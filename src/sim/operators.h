#pragma once

namespace stowage::sim::detail {

// Registers the simulated device's ATen kernels for DispatchKey::PrivateUse1: memory,
// views and copies natively, every other op by its CPU kernel on the device's memory,
// ordered after the current stream and checked for hazards. REQUIRES: called once.
void register_operators();

}  // namespace stowage::sim::detail
