#include "train/checkpoint_host_budget.h"

#include <stowage/byte_count.h>
#include <stowage/dcp/memory_tier.h>
#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace stowage::train::detail {
namespace {

// A generous bound on one entry's record in the metadata file (its name, dtype, shape,
// chunk, file and checksum), and on the file's fixed part.
constexpr int64_t kMetadataBytesPerEntry = 1024;
constexpr int64_t kMetadataFixedBytes = 64 * 1024;

int64_t chunk_aligned(int64_t bytes) {
  return (bytes + dcp::kChunkAlignment - 1) / dcp::kChunkAlignment * dcp::kChunkAlignment;
}

}  // namespace

dcp::StagingFootprint first_save_footprint(const StateDict& state, torch::optim::Optimizer& optimizer) {
  dcp::StagingFootprint footprint = dcp::staging_footprint(dcp::SaveableState(state));
  if (!optimizer.state().empty()) return footprint;
  constexpr int64_t kAdamWStatesPerParameter = 2;  // exp_avg, exp_avg_sq (the step is a scalar)
  for (const torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      const int64_t bytes = chunk_aligned(param.numel() * static_cast<int64_t>(sizeof(float)));
      footprint.entries += kAdamWStatesPerParameter;
      footprint.total_bytes += kAdamWStatesPerParameter * bytes;
      if (bytes > footprint.largest_entry_bytes) {
        footprint.largest_entry_bytes = bytes;
        footprint.largest_entry =
            fmt::format("the optimizer's state of a parameter of shape [{}]", fmt::join(param.sizes(), ", "));
      }
    }
  }
  return footprint;
}

int64_t checkpoint_file_bytes(const dcp::StagingFootprint& footprint) {
  return footprint.total_bytes + kMetadataFixedBytes + kMetadataBytesPerEntry * footprint.entries;
}

int64_t memory_tier_reserve(int64_t keep_last, int64_t own_bytes, std::optional<int64_t> replica_bytes) {
  const int64_t files = (keep_last + 1) * (own_bytes + replica_bytes.value_or(0));
  return files + (replica_bytes ? dcp::MemoryTier::replication_buffer_bytes(own_bytes, *replica_bytes) : 0);
}

int64_t staging_budget(int64_t budget, const dcp::StagingFootprint& footprint, int64_t tier_reserve) {
  const int64_t smallest = footprint.largest_entry_bytes + tier_reserve;
  if (budget < smallest) {
    const std::string tier = tier_reserve > 0 ? fmt::format(
                                                    ", plus {} for the memory tier's checkpoints (keep_last + 1, own "
                                                    "and replicas, and a replication's buffers)",
                                                    bytes_exactly(tier_reserve))
                                              : "";
    throw InvalidArgument(fmt::format(
        "TrainerOptions: checkpoint_host_budget_bytes of {} is too small; the smallest that fits is {}: the largest "
        "entry, '{}' of {}, staged whole{}",
        bytes_exactly(budget), bytes_exactly(smallest), footprint.largest_entry,
        bytes_exactly(footprint.largest_entry_bytes), tier));
  }
  return budget - tier_reserve;
}

}  // namespace stowage::train::detail
