#pragma once

// Where the memory tier's replicas lie, as its tests see them from outside (the layout
// dcp/memory_tier.h states): for the tier's tests with ranks as threads (tests/dcp) and
// with `stowage train`'s processes (tests/cli).

#include <stowage/dcp/checkpoint_directory.h>

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace stowage::testing {

// <root>/node-<N>/replica-of-rank-<R>-of-<W>/step-<S>: the replica of rank `of`'s
// `step` that node `node` holds, in a job of `world` ranks.
inline std::string memory_replica_path(const std::string& root, int64_t node, int64_t of, int64_t world, int64_t step) {
  return (std::filesystem::path(root) / fmt::format("node-{}", node) /
          fmt::format("replica-of-rank-{}-of-{}", of, world) / dcp::step_directory_name(step))
      .string();
}

}  // namespace stowage::testing
