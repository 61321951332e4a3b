// Crash consistency of the memory tier (issue 40): two ranks on two "nodes" (crash_child
// in memory mode, real processes of one c10d job) save and replicate step after step
// until both are killed with SIGKILL at a random moment; half the time the second node is
// then lost too (its directory removed). After every kill:
// - every committed checkpoint in the tier, own or replica, loads and holds exactly the
//   bytes its rank saved at its step (0 torn);
// - the tier's restore, on two ranks, gives each rank exactly its state of a step at
//   least as new as the last one both ranks reported, from its memory or its peer's
//   replica, never a half-written one;
// - the next save removes what the killed ones left half-written.
// STOWAGE_MEMORY_CRASH_TRIALS sets the number of trials (scripts/crash_trials.sh),
// STOWAGE_CRASH_SEED the seed.

#include "build_paths.h"
#include "dcp/test_util.h"
#include "reliability/crash_child_process.h"
#include "reliability/generations.h"
#include "reliability/report.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/dcp.h>
#include <stowage/dcp/memory_tier.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <random>
#include <regex>
#include <set>

#include <signal.h>
#include <sys/wait.h>

namespace stowage::reliability {
namespace {
namespace fs = std::filesystem;
using dcp::testing::ScratchDir;

constexpr int64_t kRanks = 2;  // one a node

struct MemoryTrialFigures {
  int64_t trials = 0;
  int64_t commits_reported = 0;
  int64_t nodes_lost = 0;
  int64_t checkpoints_verified = 0;  // committed ones, own and replicas, loaded bit-exact
  int64_t torn = 0;                  // committed ones that did not
  int64_t half_written_left = 0;     // uncommitted ones a kill left
  int64_t restored_from_memory = 0;
  int64_t restored_from_replica = 0;
  int64_t restored_nothing = 0;
};

// The rank and step a memory checkpoint's path names: .../rank-R-of-2/step-S or
// .../replica-of-rank-R-of-2/step-S.
std::pair<int64_t, int64_t> rank_and_step(const fs::path& checkpoint) {
  static const std::regex owner(R"((?:replica-of-)?rank-(\d+)-of-\d+)");
  std::smatch match;
  const std::string parent = checkpoint.parent_path().filename().string();
  if (!std::regex_match(parent, match, owner))
    throw std::runtime_error("not a memory checkpoint: " + checkpoint.string());
  return {std::stoll(match[1]), std::stoll(checkpoint.filename().string().substr(std::string("step-").size()))};
}

std::vector<fs::path> memory_checkpoints(const std::string& root) {
  std::vector<fs::path> out;
  if (!fs::exists(root)) return out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("step-", 0) == 0) out.push_back(entry.path());
  }
  return out;
}

class MemoryTierTrials {
 public:
  explicit MemoryTierTrials(const ScratchDir& scratch)
      : root_(scratch.sub("memory")), storage_(scratch.sub("storage")) {}

  void run_trial(std::mt19937_64& random) {
    const int64_t first_step = next_step_;
    const Reported reported = run_until_killed(random);
    if (::testing::Test::HasFatalFailure()) return;
    ++figures_.trials;
    const int64_t both_committed = *std::min_element(reported.committed.begin(), reported.committed.end());
    const int64_t both_replicated = *std::min_element(reported.replicated.begin(), reported.replicated.end());
    expect_half_written_removed(both_committed >= first_step, both_replicated >= first_step);
    // A lost node's ranks resume from the replicas their peers hold, which lag a save
    // behind: the step rank 0 said it had replicated (its replica of rank 1 committed)
    // at least; nothing is promised when it said none.
    int64_t restorable = both_committed;
    if (std::bernoulli_distribution(0.5)(random)) {
      fs::remove_all(fs::path(root_) / "node-1");
      ++figures_.nodes_lost;
      restorable = reported.replicated[0];
    }
    verify_every_committed_checkpoint();
    restore_and_verify(restorable);
  }

  const MemoryTrialFigures& figures() const { return figures_; }

 private:
  // The last step each rank reported committed (next_step_ - 1 if none), and the last one
  // it reported replicated in this trial (0 if none).
  struct Reported {
    std::array<int64_t, kRanks> committed;
    std::array<int64_t, kRanks> replicated;
  };

  // Starts both ranks at next_step_, lets them save until a random moment, kills both.
  Reported run_until_killed(std::mt19937_64& random) {
    const std::string port = std::to_string(stowage::testing::free_port());
    std::vector<std::unique_ptr<CrashChild>> ranks;
    for (int64_t rank = 0; rank < kRanks; ++rank) {
      ranks.push_back(std::make_unique<CrashChild>(
          std::vector<std::string>{test_paths::crash_child(), root_, "memory", std::to_string(next_step_)},
          std::vector<std::string>{"MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "WORLD_SIZE=2",
                                   fmt::format("RANK={}", rank), fmt::format("GROUP_RANK={}", rank),
                                   "LOCAL_WORLD_SIZE=1", "LOCAL_RANK=0"}));
    }
    for (auto& rank : ranks) {
      const std::optional<std::string> ready = rank->next_line(Clock::now() + std::chrono::seconds(120));
      EXPECT_EQ(ready.value_or("<nothing>"), "ready");
    }
    Reported reported{{next_step_ - 1, next_step_ - 1}, {0, 0}};
    const auto take = [&](size_t rank, const std::string& line) {
      int64_t step = -1;
      if (std::sscanf(line.c_str(), "replicated %ld", &step) == 1) {
        ASSERT_EQ(step, reported.committed[rank]) << "rank " << rank << ": the previous save's replication";
        reported.replicated[rank] = step;
        return;
      }
      ASSERT_EQ(std::sscanf(line.c_str(), "committed %ld", &step), 1) << line;
      ASSERT_EQ(step, reported.committed[rank] + 1) << "rank " << rank;
      reported.committed[rank] = step;
      ++figures_.commits_reported;
    };
    const double delay_ms = std::uniform_real_distribution<double>(0.0, 6.0 * mean_save_ms_)(random);
    const Clock::time_point start = Clock::now();
    const Clock::time_point kill_at = start + std::chrono::microseconds(int64_t(delay_ms * 1000));
    while (const std::optional<std::string> line = ranks[0]->next_line(kill_at)) take(0, *line);
    const int64_t rank0_commits = reported.committed[0] - (next_step_ - 1);
    if (rank0_commits > 0) {
      const double per_save = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / rank0_commits;
      mean_save_ms_ = 0.7 * mean_save_ms_ + 0.3 * per_save;
    }
    const size_t first = std::bernoulli_distribution(0.5)(random) ? 0 : 1;  // which dies first
    for (const size_t rank : {first, 1 - first}) {
      const int status = ranks[rank]->kill_and_reap();
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "rank " << rank << " ended: " << status;
    }
    // Whatever either said before dying counts.
    for (size_t rank = 0; rank < ranks.size(); ++rank) {
      while (const std::optional<std::string> line = ranks[rank]->next_line(Clock::now())) take(rank, *line);
    }
    return reported;
  }

  // Every committed checkpoint holds exactly its rank's state at its step; the half-written
  // ones are counted (the next save must remove them).
  // A save on both ranks since the kill that left them removed the own ones, a
  // replication the replicas (or wrote and committed the same step again).
  void expect_half_written_removed(bool saved, bool replicated) {
    for (auto left = half_written_.begin(); left != half_written_.end();) {
      const bool replica = left->find("/replica-of-rank-") != std::string::npos;
      if (!(replica ? replicated : saved)) {
        ++left;
        continue;
      }
      EXPECT_TRUE(!fs::exists(*left) || fs::exists(dcp::testing::metadata_path(*left))) << "survived a save: " << *left;
      left = half_written_.erase(left);
    }
  }

  void verify_every_committed_checkpoint() {
    for (const fs::path& checkpoint : memory_checkpoints(root_)) {
      if (!fs::exists(dcp::testing::metadata_path(checkpoint.string()))) {
        half_written_.insert(checkpoint.string());
        ++figures_.half_written_left;
        continue;
      }
      const auto [rank, step] = rank_and_step(checkpoint);
      StateDict loaded = generation_state(-1);
      try {
        dcp::load(loaded, checkpoint.string());
        const std::string difference = compare_to_generation(loaded, memory_tier_generation(rank, step));
        EXPECT_EQ(difference, "") << checkpoint;
        ++(difference.empty() ? figures_.checkpoints_verified : figures_.torn);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "a committed memory checkpoint does not load: " << checkpoint << ": " << e.what();
        ++figures_.torn;
      }
    }
  }

  // The tier's restore on two ranks (threads, one c10d group): each rank gets exactly its
  // state of a step no older than `restorable`, and the next trial goes on from there.
  void restore_and_verify(int64_t restorable) {
    std::array<dcp::TierRestore, kRanks> restored;
    stowage::testing::run_ranks(kRanks, [&](const dist::ProcessGroup& group) {
      const int64_t rank = group.rank();
      dcp::MemoryTier tier(dcp::MemoryTierOptions(root_).save_every(1), dcp::NodeLayout{rank, 1}, group);
      dcp::CheckpointManager storage(storage_, dcp::CheckpointManagerOptions(), group);
      StateDict state = generation_state(-1);
      restored[rank] = tier.restore(state, storage);
      if (restored[rank].step) {
        EXPECT_EQ(compare_to_generation(state, memory_tier_generation(rank, *restored[rank].step)), "")
            << "rank " << rank << " restored step " << *restored[rank].step;
      }
    });
    const dcp::TierRestore& result = restored[0];
    EXPECT_EQ(result.step, restored[1].step);
    if (restorable >= 1) {
      ASSERT_TRUE(result.step.has_value()) << "step " << restorable << " was reported restorable";
      EXPECT_GE(*result.step, restorable);
    }
    if (!result.step) {
      ++figures_.restored_nothing;
    } else {
      EXPECT_NE(result.tier, dcp::RestoreTier::kStorage);  // storage holds nothing
      ++(result.tier == dcp::RestoreTier::kMemory ? figures_.restored_from_memory : figures_.restored_from_replica);
      next_step_ = *result.step + 1;
    }
  }

  std::string root_;
  std::string storage_;
  int64_t next_step_ = 1;
  double mean_save_ms_ = 30.0;
  std::set<std::string> half_written_;
  MemoryTrialFigures figures_;
};

TEST(CrashConsistency, KilledMemoryTierSavesLeaveEveryCommittedCheckpointWhole) {
  const int64_t trials = count_from_env("STOWAGE_MEMORY_CRASH_TRIALS", 6);
  std::mt19937_64 random(static_cast<uint64_t>(count_from_env("STOWAGE_CRASH_SEED", 8)));
  const ScratchDir scratch;
  MemoryTierTrials series(scratch);
  for (int64_t trial = 0; trial < trials; ++trial) {
    series.run_trial(random);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const MemoryTrialFigures& f = series.figures();
  EXPECT_GT(f.commits_reported, 0);
  EXPECT_GT(f.checkpoints_verified, 0);
  EXPECT_EQ(f.torn, 0);
  record_figure("memory_crash.trials", f.trials);
  record_figure("memory_crash.commits_reported", f.commits_reported);
  record_figure("memory_crash.nodes_lost", f.nodes_lost);
  record_figure("memory_crash.checkpoints_verified_bit_exact", f.checkpoints_verified);
  record_figure("memory_crash.torn", f.torn);
  record_figure("memory_crash.half_written_left", f.half_written_left);
  record_figure("memory_crash.restored_from_memory", f.restored_from_memory);
  record_figure("memory_crash.restored_from_replica", f.restored_from_replica);
  record_figure("memory_crash.restored_nothing", f.restored_nothing);
}

}  // namespace
}  // namespace stowage::reliability
