// Distributed save and load with real processes: tests/dcp/dist_worker.cpp is one rank,
// started N times by `stowage launch` (or, where launch's stop-everyone-on-failure rule
// would hide what is tested, by the test itself), talking over c10d Gloo.
#include "build_paths.h"
#include "cli/child_signal.h"
#include "cli/cli_util.h"
#include "dcp/test_util.h"

#include <stowage/dcp/dcp.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

const std::string kWorker = test_paths::binary_dir() + "/tests/dcp_dist_worker";
const std::string kStowage = test_paths::binary_dir() + "/stowage";

// `stowage launch --nproc N -- dist_worker <commands>`; every rank must succeed.
void launch(int nproc, const std::string& commands) {
  const auto run =
      ::stowage::testing::run_command(fmt::format("{} launch --nproc {} -- {} {}", kStowage, nproc, kWorker, commands));
  EXPECT_EQ(run.status, 0) << "launch --nproc " << nproc << " " << commands << "\n" << run.output;
  for (int rank = 0; rank < nproc; ++rank) {
    EXPECT_NE(run.output.find(fmt::format("rank {} of {}: ok", rank, nproc)), std::string::npos) << run.output;
  }
}

TEST(DcpDistributed, SavedWithNRanksLoadsWithMRanksAndAsyncSavesOnSeveralRanks) {
  // Row-, column-sharded (uneven) and replicated tensors, values, nested dicts: saved
  // with 1, 2 and 4 ranks, each loaded with 1, 2 and 4. The worker checks every value,
  // that replicated tensors are written once (by distinct ranks, fewest bytes first)
  // and that a shard's load reads only its own blocks.
  const ScratchDir dir;
  const std::string c1 = dir.sub("n1"), c2 = dir.sub("n2"), c4 = dir.sub("n4");
  launch(1, fmt::format("save {} load {}", c1, c1));
  launch(2, fmt::format("save {} load {} load {} async {}", c2, c1, c2, dir.sub("async2")));
  launch(4, fmt::format("save {} load {} load {} load {} async {}", c4, c1, c2, c4, dir.sub("async4")));
  launch(1, fmt::format("load {} load {}", c2, c4));
  launch(2, fmt::format("load {}", c4));
  // Each rank wrote its own data file.
  EXPECT_EQ(testing::data_files(c4).size(), 4u);
}

TEST(DcpDistributed, AFailingRankFailsEveryRankCommitsNothingAndTheNextSaveResumes) {
  // The worker checks that every rank raises a DistributedCheckpointError naming rank 1 and the
  // cause, that the previous checkpoint still loads, that nothing of the failed save
  // is left, and that the next save and load succeed.
  const ScratchDir dir;
  launch(2, fmt::format("fail {}", dir.sub("ckpt")));
}

TEST(DcpDistributed, ARankFailingBeforeTheFirstCollectiveFailsEveryRankAtOnce) {
  // A throwing Stateful, an undefined tensor or an empty path on rank 1, in save, load
  // and async_save: the worker checks that every rank raises a DistributedCheckpointError naming
  // rank 1 and the cause in under half the group's timeout (the peers did not wait for
  // it), that nothing was committed, and that the group still saves and loads.
  const ScratchDir dir;
  launch(2, fmt::format("early {}", dir.sub("ckpt")));
}

TEST(DcpDistributed, ARejectedAsyncSaveOnOneRankIsRejectedOnEveryRank) {
  // PendingSave::kReject while only rank 1's writer has a save in flight: every rank
  // rejects, naming rank 1, none starts a save, and the save in flight completes.
  const ScratchDir dir;
  launch(2, fmt::format("reject {}", dir.sub("ckpt")));
}

TEST(DcpDistributed, EmptyShardsAnywhereSaveAndLoad) {
  // An empty shard at the offset where another rank's shard starts, then random
  // shardings with empty pieces anywhere, saved and loaded into other random ones.
  const ScratchDir dir;
  launch(2, fmt::format("empty {}", dir.sub("ckpt")));
  launch(3, fmt::format("empty {}", dir.sub("ckpt3")));
}

// `world` ranks started by the test itself (launch would stop the survivors on its
// own); `dying_rank` dies mid-write in the second of two saves.
void expect_survivors_name_the_dead_rank(int world, int dying_rank) {
  const ScratchDir dir;
  const std::string ckpt = dir.sub("ckpt");
  const int port = testing::free_port();
  const std::string command = fmt::format("die{}", dying_rank);
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("STOWAGE_TEST_TIMEOUT_MS", "5000", 1);
      setenv("STOWAGE_TEST_CHECK_IN_MS", "1000", 1);
      const std::string log = dir.sub("rank" + std::to_string(rank) + ".log");
      freopen(log.c_str(), "w", stdout);
      dup2(fileno(stdout), STDERR_FILENO);
      execl(kWorker.c_str(), kWorker.c_str(), command.c_str(), ckpt.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back(pid);
  }
  // Bounded wait: the survivors must be done well within the timeout plus start-up.
  std::vector<int> status(world, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  for (size_t done = 0; done < ranks.size();) {
    int raw = 0;
    const pid_t pid = waitpid(-1, &raw, WNOHANG);
    if (pid > 0) {
      const size_t rank = std::find(ranks.begin(), ranks.end(), pid) - ranks.begin();
      ASSERT_LT(rank, ranks.size());
      status[rank] = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      ++done;
    } else if (std::chrono::steady_clock::now() > deadline) {
      // Only the ranks not reaped yet: a reaped rank's pid may name another process by now.
      for (size_t rank = 0; rank < ranks.size(); ++rank) {
        if (status[rank] == -1) EXPECT_TRUE(stowage::testing::signal_descendant(ranks[rank], SIGKILL));
      }
      FAIL() << "a rank hung after its peer died";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  EXPECT_EQ(status[dying_rank], 3) << testing::read_file(dir.sub("rank" + std::to_string(dying_rank) + ".log"));
  for (int survivor = 0; survivor < world; ++survivor) {
    if (survivor == dying_rank) continue;
    const std::string log = testing::read_file(dir.sub("rank" + std::to_string(survivor) + ".log"));
    EXPECT_EQ(status[survivor], 0) << log;
    EXPECT_NE(log.find(fmt::format("rank {} failed after", survivor)), std::string::npos) << log;
    // Its error names the dead rank (the worker checks DistributedCheckpointError::failures).
    EXPECT_NE(log.find(fmt::format("[rank {}] dead or unresponsive", dying_rank)), std::string::npos) << log;
  }
  // The first save's checkpoint is still the committed one and loads in one process.
  FileSystemReader reader(ckpt);
  const Metadata metadata = reader.read_metadata();
  EXPECT_EQ(metadata.world_size, world);
  EXPECT_EQ(metadata.find("step")->value.toInt(), 1001);
}

TEST(DcpDistributed, AKilledRankIsNamedByTheOthersWithinTheTimeout) {
  expect_survivors_name_the_dead_rank(2, 1);
}

TEST(DcpDistributed, AKilledCoordinatorHostingTheStoreIsNamedByTheOthers) {
  expect_survivors_name_the_dead_rank(2, 0);
}

TEST(DcpDistributed, RanksWaitingInOtherCollectivesLearnOfAKilledRankThroughTheStore) {
  // With 4 ranks, some survivors wait in collectives that do not involve the dead rank's
  // connections; they see the failure posted in the store and name it too.
  expect_survivors_name_the_dead_rank(4, 2);
}

}  // namespace
}  // namespace stowage::dcp
