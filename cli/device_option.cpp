#include "device_option.h"

#include <stowage/build_info.h>
#include <stowage/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>
#endif

namespace stowage::cli {
namespace {

// "sim" or "sim:N": the simulated accelerator, registered on first use with the capacity
// STOWAGE_SIM_CAPACITY gives (default 16 GiB per device).
c10::Device parse_sim_device(const std::string& text) {
  if (!build_info().with_sim) {
    throw InvalidArgument(fmt::format(
        "--device '{}': the simulated device needs LibTorch 2.x, and this stowage was built against LibTorch {} "
        "(configure it against the torch wheel: STOWAGE_LIBTORCH=wheel)",
        text, build_info().libtorch_version));
  }
#if defined(STOWAGE_WITH_SIM)
  sim::register_device();
  const std::string index = text.size() > 4 ? text.substr(4) : "0";
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos || index.size() > 3) {
    throw InvalidArgument(fmt::format("--device '{}': expected sim or sim:N, N a device index", text));
  }
  return sim::device(std::stoi(index));
#else
  return c10::Device(c10::kCPU);  // not reached
#endif
}

}  // namespace

c10::Device parse_device(const std::string& text) {
  if (text == "sim" || text.rfind("sim:", 0) == 0) return parse_sim_device(text);
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(text);
  } catch (const c10::Error& e) {
    throw InvalidArgument(fmt::format("--device '{}' is not a device: {}", text, e.what_without_backtrace()));
  }
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw InvalidArgument(
        fmt::format("--device '{}': stowage runs on the CPU, on CUDA devices, or on the simulated device sim", text));
  }
  if (!build_info().with_cuda) {
    throw InvalidArgument(fmt::format("--device '{}': this stowage was built without CUDA ({})", text,
                                      "configure it against a CUDA LibTorch, e.g. STOWAGE_LIBTORCH=wheel"));
  }
  const int count = cuda_device_count();
  const int index = device.has_index() ? device.index() : 0;
  if (index >= count) {
    throw InvalidArgument(
        fmt::format("--device '{}': this machine has {} CUDA device{} visible", text, count, count == 1 ? "" : "s"));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace stowage::cli
