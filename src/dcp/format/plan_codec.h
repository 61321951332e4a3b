#pragma once

// Plans and write results as bytes, to move between the ranks of one job (not a stored
// format: every rank runs the same build).

#include <stowage/dcp/planner.h>

#include <string>
#include <vector>

namespace stowage::dcp::detail {

std::string encode_save_plan(const SavePlan& plan);
SavePlan decode_save_plan(const std::string& bytes);

// A rank's part of the global plan: what it writes, and its replicas to hash
// (GlobalSavePlan::replicas).
struct RankAssignment {
  SavePlan plan;
  std::vector<WriteItem> replicas;
};
std::string encode_assignment(const SavePlan& plan, const std::vector<WriteItem>& replicas);
RankAssignment decode_assignment(const std::string& bytes);

// What a rank reports after writing: where its chunks went, and its replicas' hashes.
struct RankWrites {
  std::vector<WriteResult> results;
  std::vector<ReplicaHash> replica_hashes;
};
std::string encode_writes(const std::vector<WriteResult>& results, const std::vector<ReplicaHash>& replica_hashes);
RankWrites decode_writes(const std::string& bytes);

}  // namespace stowage::dcp::detail
