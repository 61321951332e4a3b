// MemoryTier::restore: the ranks agree on the newest step every rank can get from
// memory (its own, or its peer's replica), fetch what is missing, and load; or go to
// storage.

#include <stowage/dcp/memory_tier.h>

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include "dcp/checkpoint_transfer.h"
#include "dcp/memory_tier_rep.h"
#include "util/exception_message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <set>
#include <sstream>

namespace stowage::dcp {
namespace {

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

// A failed load's copy, as the ranks exchange it: which copy failed ('o': the rank's
// own, 'h': the replica it holds, 'f': the one it fetched, that is its holder's), then
// the line for TierRestore::skipped.
std::string failure_of(char copy, const std::string& line) {
  return copy + line;
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

std::string MemoryTier::Rep::fetched_failure(int64_t step, const std::string& why) const {
  return failure_of('f', fmt::format("the replica of rank {} at step {} on rank {}, fetched into {}: {}", rank, step,
                                     *peer_of(rank), own_path(step), why));
}

bool MemoryTier::Rep::fetch_missing(int64_t step, const std::vector<RankListing>& listings,
                                    std::string& failure) const {
  const bool fetching = listings[static_cast<size_t>(rank)].own.count(step) == 0;
  const std::optional<int64_t> source = source_of(rank);
  const bool sending = source && listings[static_cast<size_t>(*source)].own.count(step) == 0;
  // Each replica goes back the other way round the ring than it came.
  CheckpointTransfer transfer;
  transfer.to(source.value_or(rank)).from(peer_of(rank).value_or(rank));
  if (sending) transfer.send_path(replica_path(*source, step));
  if (fetching) transfer.receive_path(own_path(step));
  const TransferOutcome outcome = transfer_checkpoint(transfer, transfer_lanes, *own_pages);
  if (!outcome.send_error.empty()) {
    failure = failure_of('h', fmt::format("memory checkpoint {}: {}", replica_path(*source, step), outcome.send_error));
  }
  if (!fetching) return true;
  if (!outcome.came) {  // the holder says why too; this rank must not load nothing
    failure = failure_of('f', fmt::format("the replica of rank {} at step {}: rank {}, which holds it, sent nothing",
                                          rank, step, *peer_of(rank)));
  } else if (!outcome.committed) {
    failure = fetched_failure(step, outcome.receive_error);
  }
  return outcome.committed;
}

bool MemoryTier::Rep::load_from_memory(int64_t step, std::vector<RankListing>& listings, StateDict& state,
                                       const LoadOptions& load_options, TierRestore& result) const {
  const bool fetching = listings[static_cast<size_t>(rank)].own.count(step) == 0;
  result.fetched_ranks.clear();
  for (int64_t of = 0; of < world_size; ++of) {
    if (listings[static_cast<size_t>(of)].own.count(step) == 0) result.fetched_ranks.push_back(of);
  }
  std::string failure;  // failure_of(...); empty: this rank's part went well
  const bool present = result.fetched_ranks.empty() || fetch_missing(step, listings, failure);
  if (present && failure.empty()) {
    try {
      FileSystemReader reader(own_path(step), options.env());
      load(state, reader, load_options);
    } catch (const std::exception& failed) {
      failure = fetching ? fetched_failure(step, exception_message(failed))
                         : failure_of(
                               'o', fmt::format("memory checkpoint {}: {}", own_path(step), exception_message(failed)));
    }
  }
  const std::vector<std::string> failures = all_gather(failure);
  bool loaded = true;
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string& each = failures[static_cast<size_t>(r)];
    if (each.empty()) continue;
    loaded = false;
    result.skipped.push_back(each.substr(1));
    if (each[0] == 'o') listings[static_cast<size_t>(r)].own.erase(step);
    if (each[0] == 'h') listings[static_cast<size_t>(r)].held.erase(step);
    if (each[0] == 'f') listings[static_cast<size_t>(*peer_of(r))].held.erase(step);
  }
  if (loaded) {
    result.step = step;
    result.tier = result.fetched_ranks.empty() ? RestoreTier::kMemory : RestoreTier::kPeerReplica;
  } else {
    result.fetched_ranks.clear();
  }
  return loaded;
}

TierRestore MemoryTier::restore(StateDict& state, CheckpointManager& storage, LoadOptions options) {
  Rep& r = *rep_;
  r.wait_for_replication();  // its replica is one this restore may read
  TierRestore result;
  const std::vector<int64_t> own = committed_stowage_steps(list_checkpoints(r.own_directory(), r.env()));
  const std::vector<int64_t> held =
      source() ? committed_stowage_steps(list_checkpoints(r.replica_directory(*source()), r.env()))
               : std::vector<int64_t>{};
  std::vector<RankListing> listings;
  for (const std::string& text : r.all_gather(encode(own, held))) listings.push_back(decode(text));
  std::string stored_text;  // the storage's newest checkpoint of stowage's format, as rank 0 sees it
  if (r.rank == 0) {
    const std::vector<int64_t> stored = committed_stowage_steps(storage.list());
    if (!stored.empty()) stored_text = std::to_string(stored.back());
  }
  if (r.group) stored_text = r.group->broadcast(stored_text, 0);
  const std::optional<int64_t> newest_stored =
      stored_text.empty() ? std::nullopt : std::optional<int64_t>(std::stoll(stored_text));
  // A memory step older than storage's newest is no use. Each failed step drops the copy
  // that failed: the next try is another step, or none.
  const int64_t oldest_wanted = newest_stored.value_or(std::numeric_limits<int64_t>::min());
  std::optional<int64_t> tried;
  for (std::optional<int64_t> step = r.newest_common_step(listings); step && *step >= oldest_wanted;
       step = r.newest_common_step(listings)) {
    if (r.load_from_memory(*step, listings, state, options, result)) return result;
    tried = step;
  }
  if (tried && !newest_stored) {
    throw Error(
        fmt::format("MemoryTier::restore: loading step {} from memory failed ({}), and storage ({}) "
                    "holds no checkpoint to fall back to",
                    *tried, result.skipped.back(), storage.directory()));
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
