// Distributed save and load with real processes: tests/dcp/dist_worker.cpp is one rank,
// started N times by `stowage launch` (or, where launch's stop-everyone-on-failure rule
// would hide what is tested, by the test itself), talking over c10d Gloo.
#include "cli/cli_util.h"
#include "dcp/test_util.h"

#include <stowage/dcp/dcp.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

const std::string kWorker = std::string(STOWAGE_BINARY_DIR) + "/tests/dcp_dist_worker";
const std::string kStowage = std::string(STOWAGE_BINARY_DIR) + "/stowage";

// `stowage launch --nproc N -- dist_worker <commands>`; every rank must succeed.
void launch(int nproc, const std::string& commands) {
  const auto run = ::stowage::testing::run_command(
      fmt::format("{} launch --nproc {} -- {} {}", kStowage, nproc, kWorker, commands));
  EXPECT_EQ(run.status, 0) << "launch --nproc " << nproc << " " << commands << "\n" << run.output;
  for (int rank = 0; rank < nproc; ++rank) {
    EXPECT_NE(run.output.find(fmt::format("rank {} of {}: ok", rank, nproc)), std::string::npos) << run.output;
  }
}

// A port the kernel reports free now; rank 0's TCPStore binds it moments later.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  close(fd);
  return ntohs(addr.sin_port);
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
  // The worker checks that every rank raises a CheckpointError naming rank 1 and the
  // cause, that the previous checkpoint still loads, that nothing of the failed save
  // is left, and that the next save and load succeed.
  const ScratchDir dir;
  launch(2, fmt::format("fail {}", dir.sub("ckpt")));
}

TEST(DcpDistributed, AKilledRankMakesTheOthersFailWithinTheTimeout) {
  // launch would stop the survivors itself; here they must notice on their own.
  const ScratchDir dir;
  const std::string ckpt = dir.sub("ckpt");
  const int port = free_port();
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("STOWAGE_TEST_TIMEOUT_MS", "5000", 1);
      const std::string log = dir.sub("rank" + std::to_string(rank) + ".log");
      freopen(log.c_str(), "w", stdout);
      dup2(fileno(stdout), STDERR_FILENO);
      execl(kWorker.c_str(), kWorker.c_str(), "die", ckpt.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ranks.push_back(pid);
  }
  // Bounded wait: the survivor must be done well within the timeout plus start-up.
  std::vector<int> status(2, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  for (size_t done = 0; done < ranks.size();) {
    int raw = 0;
    const pid_t pid = waitpid(-1, &raw, WNOHANG);
    if (pid > 0) {
      status[pid == ranks[0] ? 0 : 1] = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      ++done;
    } else if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t rank : ranks) kill(rank, SIGKILL);
      FAIL() << "a rank hung after its peer died";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const std::string log0 = testing::read_file(dir.sub("rank0.log"));
  EXPECT_EQ(status[1], 3) << testing::read_file(dir.sub("rank1.log"));  // died as injected
  EXPECT_EQ(status[0], 0) << log0;
  EXPECT_NE(log0.find("rank 0 failed after"), std::string::npos) << log0;
  // The first save's checkpoint is still the committed one and loads in one process.
  FileSystemReader reader(ckpt);
  const Metadata metadata = reader.read_metadata();
  EXPECT_EQ(metadata.world_size, 2);
  EXPECT_EQ(metadata.find("step")->value.toInt(), 1001);
}

}  // namespace
}  // namespace stowage::dcp
