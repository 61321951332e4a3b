#pragma once

// How the ranks of a distributed save or load tell each other what happened. Invariant
// of the steps that use them: every rank runs every collective of a save (or load), in
// the same order, whatever failed, so that failures travel as data and the group stays
// in step. Only a collective's own failure (a dead or hung rank) ends a rank's part
// early. Outcomes and verdicts are bytes for the collectives (JSON, not a stored format:
// every rank runs the same build).

#include <stowage/dcp/checkpoint.h>
#include <stowage/dist/process_group.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// The failure the exception in flight describes, its message after `prefix`.
RankFailure failure_in_flight(const std::string& prefix = "");
// A failure that is no exception's: kError with `message`.
RankFailure plain_failure(const std::string& message);

// A rank's outcome of one step: its payload, or its failure.
std::string outcome_ok(const std::string& payload);
std::string outcome_failed(const RankFailure& failure);
// The outcome of running `step` (which returns the payload): its failure if it throws.
template <typename Step>
std::string attempt(Step&& step) {
  std::string payload;
  try {
    payload = step();
  } catch (...) {
    return outcome_failed(failure_in_flight());
  }
  return outcome_ok(payload);
}
// Whether an outcome or a verdict is a success.
bool succeeded(const std::string& outcome_or_verdict);

// The failed ranks among gathered outcomes (indexed by rank), and the payloads of the
// others, in rank order.
std::map<int64_t, RankFailure> failures_of(const std::vector<std::string>& outcomes,
                                           std::vector<std::string>* payloads = nullptr);

// The coordinator's verdict on a step, sent to every rank: a payload, or the failures.
std::string verdict_ok(const std::string& payload);
std::string verdict_failed(const std::map<int64_t, RankFailure>& failures);
// The payload of a verdict; throws CheckpointError of `step` with its failures.
std::string accept(const std::string& verdict, const char* step);

// Rethrows the exception in flight, a dist::CollectiveError as a CheckpointError of
// `step` naming the ranks that did not check in (or else this one, `rank`).
[[noreturn]] void rethrow_as_checkpoint_error(const char* step, int64_t rank);

}  // namespace stowage::dcp::detail
