#pragma once

// The ranks of a job as torchrun and `stowage launch` describe them in the environment
// (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and each rank's device.
//
//   dist::World world = dist::join_world();        // a job of one: no group
//   const c10::Device device = dist::rank_device(c10::Device("cuda"));  // cuda:LOCAL_RANK (or cuda:0)
//   dist::GradientReducer reducer(params, *world.group);  // when world.group

#include <stowage/dist/process_group.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace stowage::dist {

struct World {
  std::optional<ProcessGroup> group;  // none in a job of one process
  int64_t rank = 0;
  int64_t size = 1;
};

// The launcher's variable `name` (RANK, LOCAL_RANK, GROUP_RANK, ...) as a non-negative
// integer; nothing when it is unset or empty. Throws InvalidArgument naming the variable
// and its value when that is not a non-negative decimal integer. The one reading of
// the launcher's integers: the process group, the device and the memory tier's nodes.
std::optional<int64_t> launcher_count(const char* name);

// Joins the job the environment describes: a World of one, without a group, when
// WORLD_SIZE is unset or 1; otherwise init_process_group_from_env(options), with its
// errors (InvalidArgument naming a missing or malformed variable, Error for a failed
// rendezvous).
World join_world(ProcessGroupOptions options = {});

// This rank's device for `device`, always with an index but for the CPU: a device of any
// other type named without one ("cuda", "sim") is the one of index LOCAL_RANK, one
// device per rank of a node, or of index 0 when the environment does not set LOCAL_RANK
// (a job of one process); the CPU, and a device with an index, is `device` itself.
// Needs no device present. Throws InvalidArgument naming a LOCAL_RANK that is not a
// non-negative integer.
c10::Device rank_device(c10::Device device);

}  // namespace stowage::dist
