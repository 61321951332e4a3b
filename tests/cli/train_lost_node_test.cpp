// Lost nodes under `stowage train`'s memory tier (issue 40), as real processes: a job of
// `--nproc N --nproc-per-node K` whose nodes each have a memory directory (node-<N> under
// --memory-ckpt-dir). A node is lost when its ranks are SIGKILLed and its directory
// removed; the job restarted with --resume ends bit-identical to a run that never failed.
// Two nodes hold each other's replicas; on a ring of three, node 1's replicas are on
// node 2 and node 0's are on node 1, so a replica sent or fetched the wrong way round the
// ring shows.

#include "cli/background_train.h"
#include "cli/child_signal.h"
#include "cli/train_util.h"
#include "dcp/memory_tier_copies.h"

#include <stowage/dcp/metadata.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace stowage::testing {
namespace {

// A job over `nodes` nodes of `ranks_per_node` ranks, training `steps` steps and saving
// to storage every `ckpt_every`; `memory` is the root of its nodes' memory directories.
struct LostNodeJob {
  int nodes = 2;
  int ranks_per_node = 2;
  int steps = 40;
  int ckpt_every = 40;

  int world() const { return nodes * ranks_per_node; }
  // The small model, its global batch split evenly over the ranks.
  const std::string& model() const { return 8 % world() == 0 ? kSmall : kSmallForThreeRanks; }
  std::string args() const {
    return fmt::format("--nproc {} --nproc-per-node {} --steps {} --ckpt-every {}", world(), ranks_per_node, steps,
                       ckpt_every);
  }
  // With the memory tier every 2 steps.
  std::string tiered(const std::string& memory) const {
    return args() + " --memory-ckpt-every 2 --memory-ckpt-dir " + memory;
  }
  std::string replica(const std::string& memory, int node, int of, int step) const {
    return memory_replica_path(memory, node, of, world(), step);
  }
};

// Runs `job` with its memory tier in `memory` until every checkpoint of `ready` is
// committed, then loses `nodes`: SIGKILLs their ranks, waits for the job to end, and
// removes their memory directories.
void lose_nodes_once_ready(const LostNodeJob& job, const RunDir& dir, const std::string& memory,
                           const std::vector<int>& nodes, const std::vector<std::string>& ready) {
  BackgroundTrain run(dir, job.tiered(memory), job.model());
  std::vector<int> lost_ranks;
  for (const int node : nodes) {
    for (int local = 0; local < job.ranks_per_node; ++local) lost_ranks.push_back(node * job.ranks_per_node + local);
  }
  std::map<int, pid_t> ranks;
  ASSERT_TRUE(run.wait_until([&] {
    ranks = ranks_by_number(dir.str());
    // Committed, not only begun: a replica's directory is there while its files arrive.
    return std::all_of(ready.begin(), ready.end(),
                       [](const std::string& path) { return fs::exists(fs::path(path) / dcp::kMetadataFileName); }) &&
           std::all_of(lost_ranks.begin(), lost_ranks.end(), [&](int rank) { return ranks.count(rank) > 0; });
  })) << run.output();
  for (const int rank : lost_ranks) ASSERT_TRUE(signal_descendant(ranks.at(rank), SIGKILL)) << "rank " << rank;
  ASSERT_NE(run.finish(), 0) << "the run ended before its nodes were lost: " << run.output();
  for (const int node : nodes) fs::remove_all(fs::path(memory) / fmt::format("node-{}", node));
}

// The job restarted with --resume: its exit status and output. A restart that hangs (a
// rank left without its state, waiting for the others) is killed after two minutes and
// reported so.
CommandResult resume_job(const LostNodeJob& job, const RunDir& dir, const std::string& memory) {
  BackgroundTrain run(dir, job.tiered(memory) + " --resume", job.model());
  CommandResult result;
  result.status = run.finish();
  result.output = run.output();
  return result;
}

// What "resume: from <tier> (step S[, ranks ... fetched theirs])" says; no tier if none.
struct ResumedFrom {
  std::string tier;
  int step = -1;
  std::string fetched;  // "2, 3"; empty when no rank fetched
};

ResumedFrom resumed_from(const std::string& output) {
  static const std::regex line(
      R"(resume: from (memory|peer replica|storage) \(step (\d+)(?:, ranks ([\d, ]+) fetched theirs)?\))");
  std::smatch match;
  if (!std::regex_search(output, match, line)) return {};
  return ResumedFrom{match[1], std::stoi(match[2]), match[3]};
}

// Issue 40: two "nodes" of two ranks. Node 1 is lost once node 0 holds its replicas; the
// restarted job resumes from them at the last memory step that every rank can get.
TEST(TrainLostNode, ALostNodeResumesFromItsPeersReplicasAndEndsBitIdentical) {
  RunDir straight, failed, memory_root;  // each removed with the test, however it ends
  const LostNodeJob job{2, 2, 40, 40};
  const std::string memory = memory_root.str();
  ASSERT_EQ(train(straight, job.args(), job.model()).status, 0);
  ASSERT_NO_FATAL_FAILURE(lose_nodes_once_ready(job, failed, memory, {1}, {job.replica(memory, 0, 2, 4)}));
  const CommandResult resumed = resume_job(job, failed, memory);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const ResumedFrom from = resumed_from(resumed.output);
  EXPECT_EQ(from.tier, "peer replica") << resumed.output;
  EXPECT_EQ(from.fetched, "2, 3") << resumed.output;
  expect_same_checkpoint(step_dir(straight, 40), step_dir(failed, 40));
}

// A ring of three nodes of one rank: node 1 lost, rank 1 fetches its checkpoint from node
// 2's replica, not node 0's, and the job ends as if nothing had failed.
TEST(TrainLostNode, OnARingOfThreeNodesNode1ResumesFromNode2sReplicasBitIdentical) {
  RunDir straight, failed, memory_root;
  const LostNodeJob job{3, 1, 24, 24};
  const std::string memory = memory_root.str();
  ASSERT_EQ(train(straight, job.args(), job.model()).status, 0);
  ASSERT_NO_FATAL_FAILURE(lose_nodes_once_ready(job, failed, memory, {1}, {job.replica(memory, 2, 1, 4)}));
  const CommandResult resumed = resume_job(job, failed, memory);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const ResumedFrom from = resumed_from(resumed.output);
  EXPECT_EQ(from.tier, "peer replica") << resumed.output;
  EXPECT_GE(from.step, 4) << resumed.output;
  EXPECT_EQ(from.fetched, "1") << resumed.output;
  expect_same_checkpoint(step_dir(straight, job.steps), step_dir(failed, job.steps));
}

}  // namespace
}  // namespace stowage::testing
