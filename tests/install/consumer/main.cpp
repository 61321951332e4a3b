#include <stowage/stowage.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>
#endif

#include <ATen/ATen.h>

#include <iostream>

int main() {
  stowage::StateDict sd;
  sd.insert("w", at::ones({2, 2}));
#if defined(STOWAGE_WITH_SIM)
  // The simulated device, as a user testing their device paths links it.
  stowage::sim::register_device();
  sd.insert("w", sd.at("w").toTensor().to(stowage::sim::device(0)));
#endif
  stowage::StateDict staged = stowage::create_cpu_state_dict(sd);
  stowage::copy_state_dict(sd, staged);
  bool ok = staged.at("w").toTensor().equal(sd.at("w").toTensor().cpu());
  try {  // stowage::interop's, linked from the installed package
    stowage::dcp::open_checkpoint("/nonexistent/stowage-consumer-checkpoint");
    ok = false;
  } catch (const stowage::NotFound&) {
  }
  std::cout << "stowage " << STOWAGE_VERSION << " on " << sd.at("w").toTensor().device() << (ok ? " ok" : " mismatch")
            << "\n";
  return ok ? 0 : 1;
}
