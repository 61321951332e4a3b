#include <stowage/stowage.h>

#include <ATen/ATen.h>

#include <iostream>

int main() {
  stowage::StateDict sd;
  sd.insert("w", at::ones({2, 2}));
  stowage::StateDict staged = stowage::create_cpu_state_dict(sd);
  stowage::copy_state_dict(sd, staged);
  const bool ok = staged.at("w").toTensor().equal(sd.at("w").toTensor());
  std::cout << "stowage " << STOWAGE_VERSION << (ok ? " ok" : " mismatch") << "\n";
  return ok ? 0 : 1;
}
