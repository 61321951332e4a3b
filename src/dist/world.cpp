#include <stowage/dist/world.h>
#include <stowage/error.h>

#include "util/decimal.h"

#include <fmt/format.h>

#include <cstdlib>
#include <limits>
#include <string>

namespace stowage::dist {

std::optional<int64_t> launcher_count(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::optional<int64_t> value = parse_decimal_digits(text);
  if (!value) throw InvalidArgument(fmt::format("{}='{}' is not a non-negative integer", name, text));
  return value;
}

World join_world(ProcessGroupOptions options) {
  World world;
  const char* size = std::getenv("WORLD_SIZE");
  if (size == nullptr || std::string(size) == "1") return world;
  world.group = init_process_group_from_env(options);
  world.rank = world.group->rank();
  world.size = world.group->size();
  return world;
}

c10::Device rank_device(c10::Device device) {
  if (device.is_cpu() || device.has_index()) return device;
  // No launcher: a job of one process, on the first device.
  const int64_t local_rank = launcher_count("LOCAL_RANK").value_or(0);
  if (local_rank > std::numeric_limits<c10::DeviceIndex>::max()) {
    throw InvalidArgument(fmt::format("LOCAL_RANK={} is beyond any device index", local_rank));
  }
  return c10::Device(device.type(), static_cast<c10::DeviceIndex>(local_rank));
}

}  // namespace stowage::dist
