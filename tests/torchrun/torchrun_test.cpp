// stowage under a real torchrun (PyTorch's elastic launcher, from the torch wheel of
// scripts/python_env.sh): dcp save/load and `stowage train` with two ranks on one node,
// two nodes (two torchrun agents meeting through the c10d rendezvous on loopback), and an
// elastic restart after a rank is SIGKILLed, and after a whole node is lost. Skipped, with the reason, in a build that
// has no torchrun (Debian's LibTorch comes without one).
#include "build_paths.h"
#include "cli/child_signal.h"
#include "cli/train_util.h"
#include "dcp/test_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace stowage::testing {
namespace {

const std::string kTorchrun = test_paths::torchrun();
const std::string kWorker = test_paths::binary_dir() + "/tests/dcp_dist_worker";

#define SKIP_WITHOUT_TORCHRUN()                                                \
  if (kTorchrun.empty())                                                       \
  GTEST_SKIP() << "no torchrun in this build: configure with the torch wheel " \
                  "(STOWAGE_LIBTORCH=wheel)"

// A free loopback port for a rendezvous or a store.
int free_port() {
  return dcp::testing::free_port();
}

std::string torchrun(const std::string& args) {
  // --monitor-interval 0.1: notice a dead worker quickly; the rendezvous stays on loopback.
  return fmt::format("{} --no-python --monitor-interval 0.1 --master-addr 127.0.0.1 {}", kTorchrun, args);
}

TEST(Torchrun, SavesAndLoadsADistributedCheckpointWithTwoRanks) {
  SKIP_WITHOUT_TORCHRUN();
  const dcp::testing::ScratchDir dir;
  const std::string c2 = dir.sub("n2");
  const auto run = run_command(torchrun(fmt::format("--nproc-per-node 2 --master-port {} {} save {} load {} async {}",
                                                    free_port(), kWorker, c2, c2, dir.sub("async"))));
  ASSERT_EQ(run.status, 0) << run.output;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(run.output.find(fmt::format("rank {} of 2: ok", rank)), std::string::npos) << run.output;
  }
  EXPECT_EQ(dcp::testing::data_files(c2).size(), 2u);
}

// `stowage train` with the small model of train_util.h, under torchrun's arguments.
std::string train_under_torchrun(const std::string& torchrun_args, const RunDir& dir, const std::string& args) {
  return torchrun(
      fmt::format("{} {} train --run-dir {}{} {}", torchrun_args, stowage_binary(), dir.str(), kSmall, args));
}

TEST(Torchrun, TrainsWithTwoRanksAsStowagesOwnLauncherDoes) {
  SKIP_WITHOUT_TORCHRUN();
  RunDir under_torchrun, under_stowage;
  const auto a = run_command(train_under_torchrun(fmt::format("--nproc-per-node 2 --master-port {}", free_port()),
                                                  under_torchrun, "--steps 8 --ckpt-every 4"));
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("data-parallel over 2 ranks"), std::string::npos) << a.output;
  const auto b = train(under_stowage, "--nproc 2 --steps 8 --ckpt-every 4");
  ASSERT_EQ(b.status, 0) << b.output;
  expect_same_checkpoint(step_dir(under_torchrun, 8), step_dir(under_stowage, 8));
}

TEST(Torchrun, TrainsOnTwoNodesMeetingThroughTheC10dRendezvous) {
  SKIP_WITHOUT_TORCHRUN();
  RunDir two_nodes, one_node;
  const std::string rendezvous =
      fmt::format("--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{} --rdzv-id stowage-{}",
                  free_port(), getpid());
  const std::string node = train_under_torchrun(rendezvous, two_nodes, "--steps 8 --ckpt-every 4");
  auto second = std::async(std::launch::async, [&] { return run_command(node); });
  const auto first = run_command(node);
  const auto other = second.get();
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_EQ(other.status, 0) << other.output;
  ASSERT_EQ(train(one_node, "--nproc 2 --steps 8 --ckpt-every 4").status, 0);
  expect_same_checkpoint(step_dir(two_nodes, 8), step_dir(one_node, 8));
}

// The pids of the `stowage train` workers whose command line names `run_dir`.
std::vector<pid_t> train_workers(const std::string& run_dir) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code error;
    if (fs::read_symlink(entry.path() / "exe", error) != fs::path(stowage_binary())) continue;
    std::ifstream file(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (cmdline.find(run_dir) != std::string::npos) pids.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return pids;
}

bool committed(const std::string& checkpoint) {
  return fs::exists(fs::path(checkpoint) / ".metadata.json");
}

TEST(Torchrun, AnElasticRestartAfterAKilledRankResumesAndEndsBitIdentical) {
  SKIP_WITHOUT_TORCHRUN();
  RunDir interrupted, straight;
  constexpr int kSteps = 60, kEvery = 10, kKillAfter = 20;
  const std::string args = fmt::format("--steps {} --ckpt-every {} --keep 10 --resume", kSteps, kEvery);
  auto job = std::async(std::launch::async, [&] {
    return run_command(train_under_torchrun(
        fmt::format("--nproc-per-node 2 --max-restarts 1 --master-port {}", free_port()), interrupted, args));
  });
  // Kill rank 1's process once step kKillAfter is committed, while the run goes on.
  bool killed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!killed && job.wait_for(std::chrono::milliseconds(5)) == std::future_status::timeout &&
         std::chrono::steady_clock::now() < deadline) {
    if (!committed(step_dir(interrupted, kKillAfter)) || committed(step_dir(interrupted, kSteps))) continue;
    const auto workers = train_workers(interrupted.str());
    if (workers.size() == 2) killed = bool(stowage::testing::signal_descendant(workers.back(), SIGKILL));
  }
  const auto result = job.get();
  ASSERT_TRUE(killed) << "the run ended before a rank could be killed after step " << kKillAfter << "\n"
                      << result.output;
  ASSERT_EQ(result.status, 0) << result.output;
  // The restarted workers resumed from a committed checkpoint (not from step 0).
  EXPECT_NE(result.output.find("resume: from"), std::string::npos) << result.output;
  ASSERT_EQ(train(straight, fmt::format("--nproc 2 --steps {} --ckpt-every {} --keep 10", kSteps, kEvery)).status, 0);
  expect_same_checkpoint(step_dir(interrupted, kSteps), step_dir(straight, kSteps));
}

// The pid of the torchrun agent whose command line names `run_dir`, or -1.
pid_t torchrun_agent(const std::string& run_dir) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream file(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (cmdline.find("torchrun") != std::string::npos && cmdline.find(run_dir) != std::string::npos &&
        cmdline.rfind("sh", 0) != 0) {
      return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

// What Kubernetes and Slurm do to a torchrun job: SIGTERM to the agent, which passes it
// to its workers. They save the step they are on, together, and a resumed run ends
// bit-identical to an uninterrupted one.
TEST(Torchrun, SigtermToTheAgentSavesTheStepAndResumeEndsBitIdentical) {
  SKIP_WITHOUT_TORCHRUN();
  RunDir preempted, straight;
  constexpr int kSteps = 30;
  const std::string args = fmt::format("--steps {} --ckpt-every 10 --resume", kSteps);
  auto job = std::async(std::launch::async, [&] {
    return run_command(
        train_under_torchrun(fmt::format("--nproc-per-node 2 --master-port {}", free_port()), preempted, args));
  });
  bool signalled = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!signalled && job.wait_for(std::chrono::milliseconds(5)) == std::future_status::timeout &&
         std::chrono::steady_clock::now() < deadline) {
    if (logged_step(preempted) < 3) continue;
    const pid_t agent = torchrun_agent(preempted.str());
    signalled = bool(stowage::testing::signal_descendant(agent, SIGTERM));
  }
  const auto result = job.get();
  ASSERT_TRUE(signalled) << "the run ended before torchrun could be signalled\n" << result.output;
  static const std::regex saved(R"(preempted by SIGTERM at step (\d+): step \1 committed)");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.output, match, saved)) << result.output;
  const int step = std::stoi(match[1]);
  ASSERT_LT(step, kSteps) << result.output;
  const auto resumed = train(preempted, "--nproc 2 " + args);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("(step {})", step)), std::string::npos) << resumed.output;
  ASSERT_EQ(train(straight, fmt::format("--nproc 2 --steps {} --ckpt-every 10", kSteps)).status, 0);
  expect_same_checkpoint(step_dir(preempted, kSteps), step_dir(straight, kSteps));
}

// Whether something listens on the loopback `port` now.
bool port_accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool accepted = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return accepted;
}

// Issue 40 under the real torchrun: two agents, two "nodes" of two ranks, each node with
// its own memory directory. Node 1 is lost (its agent and its ranks SIGKILLed, its memory
// removed) once node 0 holds its replicas; node 0's agent restarts its ranks, a new agent
// takes node 1's place, and the job resumes from node 0's replicas and ends bit-identical
// to a run that never failed. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torchrun's shared
// store (2.11's default) a node that joins a later round waits for a store address the
// surviving agent never publishes again (docs/reliability.md).
TEST(Torchrun, ALostNodeIsReplacedAndTheJobResumesFromItsPeersReplicasBitIdentical) {
  SKIP_WITHOUT_TORCHRUN();
  RunDir straight, failed, memory_0, memory_1;
  constexpr int kSteps = 40;
  const int rendezvous_port = free_port();
  const std::string rendezvous = fmt::format(
      "--nnodes 2 --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{} "
      "--rdzv-conf join_timeout=120 "
      "--rdzv-id stowage-lost-node-{}",
      rendezvous_port, getpid());
  const auto node = [&](const RunDir& memory) {
    return "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 " +
           train_under_torchrun(rendezvous, failed,
                                fmt::format("--steps {} --ckpt-every {} --memory-ckpt-every 2 --memory-ckpt-dir {} "
                                            "--resume",
                                            kSteps, kSteps, memory.str()));
  };
  // Node 0 first: its agent hosts the rendezvous, which must outlive node 1.
  auto node_0 = std::async(std::launch::async, [&] { return run_command(node(memory_0)); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!port_accepts(rendezvous_port) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto node_1 = std::async(std::launch::async, [&] { return run_command(node(memory_1)); });
  const fs::path replica = fs::path(memory_0.str()) / "node-0/replica-of-rank-2-of-4/step-00000004/.metadata.json";
  std::vector<pid_t> node_1_ranks;
  while (std::chrono::steady_clock::now() < deadline &&
         node_1.wait_for(std::chrono::milliseconds(5)) == std::future_status::timeout) {
    node_1_ranks = train_workers(memory_1.str());
    if (fs::exists(replica) && node_1_ranks.size() == 2) break;
  }
  ASSERT_EQ(node_1_ranks.size(), 2u) << "node 1 ended before it could be lost";
  // The node is lost: its agent first, so that it restarts nothing, then its ranks.
  ASSERT_TRUE(stowage::testing::signal_descendant(torchrun_agent(memory_1.str()), SIGKILL));
  for (const pid_t rank : node_1_ranks) stowage::testing::signal_descendant(rank, SIGKILL);
  EXPECT_NE(node_1.get().status, 0);
  fs::remove_all(memory_1.str());
  const auto replacement = run_command(node(memory_1));
  const auto survivor = node_0.get();
  ASSERT_EQ(survivor.status, 0) << survivor.output;
  ASSERT_EQ(replacement.status, 0) << replacement.output;
  const std::string output = survivor.output + replacement.output;
  EXPECT_NE(output.find("resume: from peer replica (step "), std::string::npos) << output;
  EXPECT_NE(output.find("ranks 2, 3 fetched theirs"), std::string::npos) << output;
  ASSERT_EQ(
      train(straight, fmt::format("--nproc 4 --nproc-per-node 2 --steps {} --ckpt-every {}", kSteps, kSteps)).status,
      0);
  expect_same_checkpoint(step_dir(straight, kSteps), step_dir(failed, kSteps));
}

}  // namespace
}  // namespace stowage::testing
