#include "commands.h"

#include <stowage/build_info.h>
#include <stowage/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

namespace stowage::cli {

c10::Device parse_device(const std::string& text) {
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(text);
  } catch (const c10::Error& e) {
    throw InvalidArgument(fmt::format("--device '{}' is not a device: {}", text, e.what_without_backtrace()));
  }
  if (device.is_cpu()) return device;
  if (!device.is_cuda()) {
    throw InvalidArgument(fmt::format("--device '{}': stowage runs on the CPU or on CUDA devices", text));
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
