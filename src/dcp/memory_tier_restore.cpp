// MemoryTier::restore: the ranks agree on the newest step every rank can get from
// memory (its own, or its peer's replica), fetch what is missing, and load; or go to
// storage.

#include <stowage/dcp/memory_tier.h>

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/verify.h>
#include <stowage/error.h>

#include "dcp/checkpoint_bundle.h"
#include "dcp/memory_tier_rep.h"
#include "util/exception_message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>
#include <sstream>

namespace stowage::dcp {
namespace {
namespace fs = std::filesystem;

// A rank's listing as the all-gather carries it: "4,6|2,4" (own|held).
std::string encode(const std::vector<int64_t>& own, const std::vector<int64_t>& held) {
  return fmt::format("{}|{}", fmt::join(own, ","), fmt::join(held, ","));
}

std::set<int64_t> decode_steps(const std::string& text) {
  std::set<int64_t> steps;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) steps.insert(std::stoll(item));
  }
  return steps;
}

RankListing decode(const std::string& text) {
  const size_t bar = text.find('|');
  TORCH_INTERNAL_ASSERT(bar != std::string::npos, "MemoryTier: a listing without '|': ", text);
  return RankListing{decode_steps(text.substr(0, bar)), decode_steps(text.substr(bar + 1))};
}

// The committed checkpoints of `directory` that verify, oldest first; each that does not
// is added to `skipped`, never listed.
std::vector<int64_t> verified_steps(const std::string& directory, Env& env, std::vector<std::string>& skipped) {
  std::vector<int64_t> steps;
  for (const int64_t step : committed_stowage_steps(list_checkpoints(directory, env))) {
    const std::string path = (fs::path(directory) / step_directory_name(step)).string();
    std::string error;
    try {
      FileSystemReader reader(path, &env);
      error = verify(reader).error;
    } catch (const std::exception& failure) {
      error = exception_message(failure);
    }
    if (error.empty()) {
      steps.push_back(step);
    } else {
      skipped.push_back(fmt::format("memory checkpoint {}: {}", path, error));
    }
  }
  return steps;
}

}  // namespace

std::optional<int64_t> MemoryTier::Rep::newest_common_step(const std::vector<RankListing>& listings) const {
  std::set<int64_t> candidates;
  for (const RankListing& listing : listings) {
    candidates.insert(listing.own.begin(), listing.own.end());
    candidates.insert(listing.held.begin(), listing.held.end());
  }
  for (auto candidate = candidates.rbegin(); candidate != candidates.rend(); ++candidate) {
    bool everyone = true;
    for (int64_t of = 0; of < world_size && everyone; ++of) {
      const std::optional<int64_t> holder = peer_of(of);
      everyone = listings[static_cast<size_t>(of)].own.count(*candidate) > 0 ||
                 (holder && listings[static_cast<size_t>(*holder)].held.count(*candidate) > 0);
    }
    if (everyone) return *candidate;
  }
  return std::nullopt;
}

bool MemoryTier::Rep::load_from_memory(int64_t step, const std::vector<RankListing>& listings, StateDict& state,
                                       const LoadOptions& load_options, TierRestore& result) const {
  const std::string own = own_path(step);
  std::string error;
  for (int64_t of = 0; of < world_size; ++of) {
    if (listings[static_cast<size_t>(of)].own.count(step) > 0) continue;
    result.fetched_ranks.push_back(of);
    const int64_t holder = *peer_of(of);  // newest_common_step saw the replica there
    std::string bundle;
    if (rank == holder) {
      try {
        bundle = pack_checkpoint(replica_path(of, step), env());
      } catch (const std::exception& failure) {
        error = exception_message(failure);  // the fetching rank sees an empty bundle
      }
    }
    bundle = send_to(holder, of, bundle);
    if (rank != of) continue;
    try {
      unpack_checkpoint(bundle, own, env());
    } catch (const std::exception& failure) {
      error = fmt::format("fetching its replica from rank {}: {}", holder, exception_message(failure));
    }
  }
  if (error.empty()) {
    try {
      FileSystemReader reader(own, options.env());
      load(state, reader, load_options);
    } catch (const std::exception& failure) {
      error = exception_message(failure);
    }
  }
  const std::string agreed = agreed_error(error);
  if (agreed.empty()) {
    result.step = step;
    result.tier = result.fetched_ranks.empty() ? RestoreTier::kMemory : RestoreTier::kPeerReplica;
    return true;
  }
  result.fetched_ranks.clear();
  result.skipped.push_back(fmt::format("memory step {}: {}", step, agreed));
  return false;
}

TierRestore MemoryTier::restore(StateDict& state, CheckpointManager& storage, LoadOptions options) {
  Rep& r = *rep_;
  TierRestore result;
  std::vector<std::string> unverified;
  const std::vector<int64_t> own = verified_steps(r.own_directory(), r.env(), unverified);
  const std::vector<int64_t> held =
      source() ? verified_steps(r.replica_directory(*source()), r.env(), unverified) : std::vector<int64_t>{};
  std::vector<RankListing> listings;
  for (const std::string& text : r.all_gather(encode(own, held))) listings.push_back(decode(text));
  for (const std::string& lines : r.all_gather(fmt::format("{}", fmt::join(unverified, "\n")))) {
    std::stringstream stream(lines);
    for (std::string line; std::getline(stream, line);) result.skipped.push_back(line);
  }
  const std::optional<int64_t> step = r.newest_common_step(listings);
  std::string stored_text;  // the storage's newest checkpoint of stowage's format, as rank 0 sees it
  if (r.rank == 0) {
    const std::vector<int64_t> stored = committed_stowage_steps(storage.list());
    if (!stored.empty()) stored_text = std::to_string(stored.back());
  }
  if (r.group) stored_text = r.group->broadcast(stored_text, 0);
  const std::optional<int64_t> newest_stored =
      stored_text.empty() ? std::nullopt : std::optional<int64_t>(std::stoll(stored_text));
  if (step && (!newest_stored || *step >= *newest_stored)) {
    if (r.load_from_memory(*step, listings, state, options, result)) return result;
    if (!newest_stored) {
      throw Error(
          fmt::format("MemoryTier::restore: loading step {} from memory failed ({}), and storage ({}) "
                      "holds no checkpoint to fall back to",
                      *step, result.skipped.back(), storage.directory()));
    }
  }
  std::vector<SkippedCheckpoint> skipped;
  result.step = storage.restore(state, options, &skipped);
  for (const SkippedCheckpoint& checkpoint : skipped) {
    result.skipped.push_back(fmt::format("storage checkpoint {}: {}", checkpoint.path, checkpoint.error));
  }
  result.tier = result.step ? RestoreTier::kStorage : RestoreTier::kNone;
  return result;
}

}  // namespace stowage::dcp
