#pragma once

// The split of TrainerOptions::checkpoint_host_budget_bytes between the memory tier and
// staging, and its check before the first step (trainer.h).

#include <stowage/dcp/staging.h>
#include <stowage/state/state_dict.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>

namespace stowage::train::detail {

// What a save of `state` will stage: the state as it is, and for each parameter of
// `optimizer` without state yet, AdamW's (two fp32 tensors of its shape), which the
// first step makes.
dcp::StagingFootprint first_save_footprint(const StateDict& state, torch::optim::Optimizer& optimizer);

// The host bytes of one checkpoint of a state whose staging takes `footprint`: its data
// (chunks at the format's alignment, as staged) and an allowance for its metadata file.
int64_t checkpoint_file_bytes(const dcp::StagingFootprint& footprint);

// What the memory tier may hold at its most: keep_last + 1 checkpoints (the newest is
// written before the oldest goes) of this rank's state, and as many of its source's
// (`replica_bytes`, a checkpoint's; nothing without a peer), with a replication's buffers.
int64_t memory_tier_reserve(int64_t keep_last, int64_t own_bytes, std::optional<int64_t> replica_bytes);

// The staging budget that `budget` leaves after the tier's reserve. Throws
// InvalidArgument naming the budget and the smallest that fits (the largest entry plus
// the reserve), both in bytes and binary units, when it leaves less than the largest
// entry.
int64_t staging_budget(int64_t budget, const dcp::StagingFootprint& footprint, int64_t tier_reserve);

}  // namespace stowage::train::detail
