#pragma once

// How the ranks of a distributed save or load tell each other what happened. Invariant
// of the steps that use them: every rank runs every collective of a save (or load), in
// the same order, whatever failed, so that failures travel as data and the group stays
// in step. Only a collective's own failure (a dead or hung rank) ends a rank's part
// early. Outcomes and verdicts are structs; only the collectives below encode them, as
// bytes between the ranks of one job (JSON, not a stored format: every rank runs the
// same build).

#include <stowage/dcp/checkpoint.h>
#include <stowage/dist/process_group.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// A rank's outcome of one step: its payload (in the step's own codec), or its failure.
struct RankOutcome {
  std::string payload;
  std::optional<RankFailure> failure;
};

// The coordinator's verdict on a step, sent to every rank: a payload, or the failures
// by rank (non-empty).
struct Verdict {
  std::string payload;
  std::map<int64_t, RankFailure> failures;
};

// The failure the exception in flight describes, its message after `prefix`.
RankFailure failure_in_flight(const std::string& prefix = "");
// A failure that is no exception's: kError with `message`.
RankFailure plain_failure(const std::string& message);

// The outcome of running `step` (which returns the payload): its failure if it throws.
template <typename Step>
RankOutcome attempt(Step&& step) {
  try {
    return {step(), std::nullopt};
  } catch (...) {
    return {"", failure_in_flight()};
  }
}

// The failed ranks among outcomes (indexed by rank), and the payloads of the others, in
// rank order.
std::map<int64_t, RankFailure> failures_of(const std::vector<RankOutcome>& outcomes,
                                           std::vector<std::string>* payloads = nullptr);

// The payload of a verdict; throws DistributedCheckpointError of `step` with its failures.
const std::string& accept(const Verdict& verdict, const char* step);

// The collectives of outcomes and verdicts, on `group` (ProcessGroup's byte collectives,
// with their errors). gather_outcomes returns every rank's outcome on `root`, nothing
// elsewhere; scatter_verdicts takes one verdict per rank on `root` (ignored elsewhere).
std::vector<RankOutcome> gather_outcomes(const dist::ProcessGroup& group, const RankOutcome& mine, int64_t root);
std::vector<RankOutcome> all_gather_outcomes(const dist::ProcessGroup& group, const RankOutcome& mine);
Verdict scatter_verdicts(const dist::ProcessGroup& group, const std::vector<Verdict>& verdicts, int64_t root);
Verdict broadcast_verdict(const dist::ProcessGroup& group, const Verdict& verdict, int64_t root);

// Rethrows the exception in flight, a dist::CollectiveError as a DistributedCheckpointError
// of `step` naming the ranks that did not check in (or else this one, `rank`).
[[noreturn]] void rethrow_as_checkpoint_error(const char* step, int64_t rank);

}  // namespace stowage::dcp::detail
