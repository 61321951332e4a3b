// `stowage train` outlives its failures (issue 24), as a real process: SIGTERM saves the
// step the run is on and exits with status 75, with one rank or two (only one of them
// signalled), and --resume then ends bit-identical to an uninterrupted run; a second
// SIGTERM exits at once without corrupting anything; a full file system costs the
// saves, not the run; a read-only one is a clear error. Every committed checkpoint left
// behind verifies.

#include "cli/background_train.h"
#include "cli/child_signal.h"
#include "cli/train_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <thread>
#include <vector>

namespace stowage::testing {
namespace {

constexpr int kPreemptedStatus = 75;

// The step of "preempted by SIGTERM at step N: step N committed", or -1.
int preempted_step(const std::string& output) {
  static const std::regex preempted(R"(preempted by SIGTERM at step (\d+): step \1 committed)");
  std::smatch match;
  return std::regex_search(output, match, preempted) ? std::stoi(match[1]) : -1;
}

void expect_every_committed_checkpoint_verifies(const RunDir& dir) {
  for (const auto& row : run_json("ckpt ls --json " + dir.str())) {
    if (!row["committed"].get<bool>()) continue;
    EXPECT_TRUE(run_json("ckpt verify --json " + row["path"].get<std::string>())["ok"].get<bool>()) << row.dump();
  }
}

// The pid of `rank` of a --nproc run in `dir`, or -1.
pid_t rank_pid(const RunDir& dir, int rank) {
  const std::map<int, pid_t> ranks = ranks_by_number(dir.str());
  const auto found = ranks.find(rank);
  return found == ranks.end() ? -1 : found->second;
}

// Whether `signal` sent to process `pid` is still pending (not yet delivered to a thread).
bool signal_pending(pid_t pid, int signal) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("ShdPnd:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (signal - 1)) & 1U;
  }
  return false;
}

// SIGTERM, once the run has logged step 3, to the process `target()` names then: the pid
// signalled is the one checked, and a run that ends or stalls first fails the test
// without a signal.
void sigterm_after_step_three(BackgroundTrain& run, const RunDir& dir, const std::function<pid_t()>& target) {
  pid_t pid = -1;
  ASSERT_TRUE(run.wait_until([&] { return logged_step(dir) >= 3 && (pid = target()) > 0; })) << run.output();
  ASSERT_TRUE(signal_descendant(pid, SIGTERM)) << run.output();
}

// A run of `args` (ending at step `steps`) SIGTERMed after step 3, its process then being
// `signalled(dir)`: it saves the step it is on, and resumed ends bit-identical to the
// run never stopped.
void expect_preempted_run_resumes_bit_identical(
    const std::string& args, int steps, const std::function<pid_t(const RunDir&, BackgroundTrain&)>& signalled) {
  RunDir straight, preempted;
  ASSERT_EQ(train(straight, args).status, 0);
  BackgroundTrain run(preempted, args);
  ASSERT_NO_FATAL_FAILURE(sigterm_after_step_three(run, preempted, [&] { return signalled(preempted, run); }));
  ASSERT_EQ(run.finish(), kPreemptedStatus) << run.output();
  const int step = preempted_step(run.output());
  ASSERT_GE(step, 3) << run.output();
  ASSERT_LT(step, steps) << "the run ended before the signal: " << run.output();
  EXPECT_TRUE(fs::exists(fs::path(step_dir(preempted, step)) / ".metadata.json"));
  expect_every_committed_checkpoint_verifies(preempted);
  const auto resumed = train(preempted, args + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("(step {})", step)), std::string::npos) << resumed.output;
  expect_same_checkpoint(step_dir(straight, steps), step_dir(preempted, steps));
}

pid_t the_launcher(const RunDir&, BackgroundTrain& run) {
  return run.pid();
}

pid_t rank_one(const RunDir& dir, BackgroundTrain&) {
  return rank_pid(dir, 1);
}

// A save is in flight at every step (--ckpt-every 1): the signal lands during one.
TEST(TrainPreempt, SigtermDuringASaveSavesTheStepTheRunIsOnAndResumeEndsBitIdentical) {
  expect_preempted_run_resumes_bit_identical("--steps 40 --ckpt-every 1", 40, the_launcher);
}

// The optimizer's update on the host (its states in host memory), all of it or half the
// parameters' bytes, on one rank or each rank its shard.
TEST(TrainPreempt, UpdateOnTheHostResumesBitIdentical) {
  expect_preempted_run_resumes_bit_identical("--steps 30 --ckpt-every 1 --optimizer-update host", 30, the_launcher);
}

TEST(TrainPreempt, HalfTheUpdateOnTheHostResumesBitIdentical) {
  expect_preempted_run_resumes_bit_identical("--steps 30 --ckpt-every 1 --optimizer-update host --offload-fraction 0.5",
                                             30, the_launcher);
}

TEST(TrainPreempt, UpdateOnTheHostOnTwoRanksResumesBitIdentical) {
  expect_preempted_run_resumes_bit_identical("--nproc 2 --steps 30 --ckpt-every 10 --optimizer-update host", 30,
                                             rank_one);
}

// Only rank 1 is signalled; the ranks agree at the next step boundary and both save it.
TEST(TrainPreempt, WhenOneOfTwoRanksIsSignalledBothSaveTheSameStep) {
  RunDir straight, preempted;
  const std::string args = "--nproc 2 --steps 30 --ckpt-every 10";
  ASSERT_EQ(train(straight, args).status, 0);
  BackgroundTrain run(preempted, args);
  ASSERT_NO_FATAL_FAILURE(sigterm_after_step_three(run, preempted, [&] { return rank_pid(preempted, 1); }));
  ASSERT_EQ(run.finish(), kPreemptedStatus) << run.output();
  const int step = preempted_step(run.output());
  ASSERT_GE(step, 3) << run.output();
  ASSERT_LT(step, 30) << "the run ended before the signal: " << run.output();
  expect_every_committed_checkpoint_verifies(preempted);
  const auto resumed = train(preempted, args + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("(step {})", step)), std::string::npos) << resumed.output;
  expect_same_checkpoint(step_dir(straight, 30), step_dir(preempted, 30));
}

// SIGTERM to the launcher's whole process group (a terminal's job control, `kill -TERM
// -<group>`, `timeout`): the ranks, in a group of their own, get it once, through the
// launcher, and save; a rank that got it twice would exit at once without saving.
TEST(TrainPreempt, SigtermToTheLaunchersProcessGroupReachesEachRankOnce) {
  RunDir preempted;
  BackgroundTrain run(preempted, "--nproc 2 --steps 300 --ckpt-every 10");
  ASSERT_TRUE(run.wait_until([&] { return logged_step(preempted) >= 3; })) << run.output();
  ASSERT_TRUE(signal_descendant_group(run.pid(), SIGTERM));
  ASSERT_EQ(run.finish(), kPreemptedStatus) << run.output();
  const int step = preempted_step(run.output());
  ASSERT_GE(step, 3) << run.output();
  EXPECT_TRUE(fs::exists(fs::path(step_dir(preempted, step)) / ".metadata.json")) << run.output();
}

// With a save in flight at every step, the second SIGTERM cuts one short: the process
// ends as SIGTERM ends it, and what it leaves is committed and whole, or not committed.
TEST(TrainPreempt, ASecondSigtermExitsAtOnceAndCorruptsNothing) {
  RunDir dir;
  const std::string args = "--steps 400 --ckpt-every 1 --keep 50";
  BackgroundTrain run(dir, args);
  ASSERT_TRUE(run.wait_until([&] { return logged_step(dir) >= 3; })) << run.output();
  ASSERT_TRUE(signal_descendant(run.pid(), SIGTERM));
  // Two signals pending at once would be one: the second goes once the first is delivered.
  while (signal_pending(run.pid(), SIGTERM)) std::this_thread::sleep_for(std::chrono::microseconds(200));
  ASSERT_TRUE(signal_descendant(run.pid(), SIGTERM));
  EXPECT_EQ(run.finish(), 128 + SIGTERM) << run.output();
  EXPECT_NE(run.output().find("a second preemption signal: exiting at once"), std::string::npos) << run.output();
  expect_every_committed_checkpoint_verifies(dir);
  const auto resumed = train(dir, "--steps 6 --ckpt-every 1 --keep 50 --resume");  // cleans what was cut short
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  for (const auto& row : run_json("ckpt ls --json " + dir.str())) EXPECT_TRUE(row["committed"].get<bool>());
}

// SIGTERM as soon as the run announces itself: during --resume's load or the first
// step. The run exits 75 with what it had (or the step it finished) committed, and
// continues exactly.
TEST(TrainPreempt, SigtermWhileResumingExitsCleanlyAndTheRunContinuesExactly) {
  RunDir straight, dir;
  ASSERT_EQ(train(straight, "--steps 8 --ckpt-every 4").status, 0);
  ASSERT_EQ(train(dir, "--steps 4 --ckpt-every 4").status, 0);
  BackgroundTrain run(dir, "--steps 8 --ckpt-every 4 --resume");
  ASSERT_TRUE(run.wait_until([&] { return run.output().find("training a") != std::string::npos; })) << run.output();
  ASSERT_TRUE(signal_descendant(run.pid(), SIGTERM));
  ASSERT_EQ(run.finish(), kPreemptedStatus) << run.output();
  EXPECT_NE(run.output().find("preempted by SIGTERM at step"), std::string::npos) << run.output();
  expect_every_committed_checkpoint_verifies(dir);
  ASSERT_EQ(train(dir, "--steps 8 --ckpt-every 4 --resume").status, 0);
  expect_same_checkpoint(step_dir(straight, 8), step_dir(dir, 8));
}

// A tmpfs of `bytes` on a fresh directory, for the test's lifetime; root only.
class SmallFileSystem {
 public:
  explicit SmallFileSystem(int64_t bytes, unsigned long flags = 0) {
    fs::create_directories(dir_.path);
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir_.str().c_str(), "tmpfs", flags, options.c_str()) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~SmallFileSystem() {
    if (mounted_) ::umount2(dir_.str().c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }
  bool mounted() const { return mounted_; }
  std::string sub(const std::string& name) const { return (dir_.path / name).string(); }

 private:
  RunDir dir_;
  bool mounted_ = false;
  std::string error_;
};

// The small model's checkpoint is 1.6 MiB: two fit in 4 MiB, the third does not.
constexpr int64_t kRoomForTwoCheckpoints = 4 << 20;

TEST(TrainSaveFailure, AFullFileSystemCostsTheSavesNotTheRun) {
  const SmallFileSystem small(kRoomForTwoCheckpoints);
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << small.error();
  const std::string run_dir = small.sub("run");
  const auto result =
      run_command(stowage_binary() + " train --run-dir " + run_dir + kSmall + " --steps 12 --ckpt-every 3 --keep 5");
  // It trains to the end, and exits 1 because its last checkpoint failed.
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find("done: steps 1-12"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("checkpoint step 9 failed, training goes on: "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("the last checkpoint (step 12) failed"), std::string::npos) << result.output;
  std::vector<int64_t> failed;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json record = json::parse(line);
    if (record["event"] != "checkpoint_failed") continue;
    failed.push_back(record["step"].get<int64_t>());
    EXPECT_NE(record["error"].get<std::string>().find("No space left on device"), std::string::npos) << line;
    EXPECT_EQ(record["path"].get<std::string>(), run_dir + "/checkpoints/step-" + fmt::format("{:08d}", failed.back()));
  }
  EXPECT_EQ(failed, (std::vector<int64_t>{9, 12}));
  const json listed = run_json("ckpt ls --json " + run_dir);
  ASSERT_EQ(listed.size(), 2u) << listed.dump();  // the partial ones were removed
  for (const auto& row : listed) {
    EXPECT_TRUE(row["committed"].get<bool>()) << row.dump();
    EXPECT_TRUE(run_json("ckpt verify --json " + row["path"].get<std::string>())["ok"].get<bool>()) << row.dump();
  }
}

// --on-save-failure stop ends the run at its first failed save (step 9's, the third
// checkpoint), before the save of step 12 begins; with --max-save-failures 100 nothing
// else would end it before step 30.
TEST(TrainSaveFailure, WithOnSaveFailureStopAFailedSaveEndsTheRun) {
  const SmallFileSystem small(kRoomForTwoCheckpoints);
  if (!small.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << small.error();
  const std::string run_dir = small.sub("run");
  const auto result = run_command(stowage_binary() + " train --run-dir " + run_dir + kSmall +
                                  " --steps 30 --ckpt-every 3 --keep 5 --on-save-failure stop --max-save-failures 100");
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_EQ(result.output.find("done:"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
  std::vector<int64_t> steps;
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json record = json::parse(line);
    if (record["event"] == "step") steps.push_back(record["step"].get<int64_t>());
  }
  ASSERT_FALSE(steps.empty()) << result.output;
  EXPECT_GE(steps.back(), 8) << "it stopped before step 9's save: " << result.output;
  EXPECT_LT(steps.back(), 12) << "it went on after step 9's save failed: " << result.output;
  const json listed = run_json("ckpt ls --json " + run_dir);
  ASSERT_EQ(listed.size(), 2u) << listed.dump();  // steps 3 and 6; step 9's partial one was removed
  for (const auto& row : listed) EXPECT_TRUE(row["committed"].get<bool>()) << row.dump();
}

TEST(TrainSaveFailure, AReadOnlyRunDirectoryIsAClearErrorBeforeTraining) {
  const SmallFileSystem read_only(1 << 20, MS_RDONLY);
  if (!read_only.mounted()) GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << read_only.error();
  const auto result = run_command(stowage_binary() + " train --run-dir " + read_only.sub("run") + kSmall);
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_NE(result.output.find(read_only.sub("run")), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("Read-only file system"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace stowage::testing
