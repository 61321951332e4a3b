#include <stowage/dist/world.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace stowage::dist {

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
  const char* local_rank = std::getenv("LOCAL_RANK");
  // No launcher: a job of one process, on the first device.
  if (local_rank == nullptr || *local_rank == '\0') return c10::Device(device.type(), 0);
  const std::string text(local_rank);
  if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 4) {
    throw InvalidArgument(fmt::format("LOCAL_RANK '{}' is not a rank's place on its node", text));
  }
  return c10::Device(device.type(), static_cast<c10::DeviceIndex>(std::stoi(text)));
}

}  // namespace stowage::dist
