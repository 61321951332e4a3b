#pragma once

// The simulated device's random generator. Its state is a CPU generator's (the CPU
// kernels that compute for the device draw from that generator), but it belongs to the
// device: torch::manual_seed seeds it, at::globalContext().defaultGenerator(sim:N)
// returns it, and its get_state/set_state are what RNG-replaying code saves and restores.

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace stowage::sim::detail {

class SimGenerator final : public c10::GeneratorImpl {
 public:
  explicit SimGenerator(c10::DeviceIndex device);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The CPU generator the device's kernels draw from.
  const at::Generator& cpu() const { return cpu_; }

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  SimGenerator* clone_impl() const override;

  mutable at::Generator cpu_;  // mutable: its mutex is locked in const calls too
};

// The default generator of sim:`device`.
const at::Generator& default_generator(c10::DeviceIndex device);

}  // namespace stowage::sim::detail
