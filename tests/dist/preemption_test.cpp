// dist::PreemptionNotice with real signals: a notice signal is kept for the loop to
// read, a second one or the grace deadline ends the process as the signal would, a
// disarmed notice ignores both, the previous handlers come back, and over a real group
// every rank learns of one rank's notice at the same agreed(). The ones that end the
// process, or need a process per rank, run as death tests (a child process).

#include <stowage/dist/preemption.h>
#include <stowage/error.h>

#include "process_groups.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

namespace stowage::dist {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

// The handler a signal has now.
void (*handler_of(int signal))(int) {
  struct sigaction current {};
  sigaction(signal, nullptr, &current);
  return current.sa_handler;
}

// The threads this process has now.
int64_t thread_count() {
  int64_t threads = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  return threads;
}

// What went wrong on `rank` of a two-rank group whose rank 1 alone is signalled, or "".
std::string check_agreement(const PreemptionNotice& notice, const ProcessGroup& group, int64_t rank) {
  if (notice.agreed(group)) return "agreed() said yes before any rank had notice";
  if (rank == 1) std::raise(SIGUSR1);
  if (!notice.agreed(group)) return "agreed() said no after rank 1's SIGUSR1";
  if (!notice.received()) return "no notice of its own after agreeing";
  if (notice.signal_number() != SIGUSR1) return fmt::format("signal {}, not SIGUSR1", notice.signal_number());
  if (!notice.agreed(group)) return "agreed() said no the second time";
  return "";
}

// One rank's part: its notice, its group and check_agreement(); `before_leaving` runs
// while the group is still up.
std::string agree_as_rank(int port, int64_t rank, const std::function<void()>& before_leaving) {
  try {
    const PreemptionNotice notice(PreemptionOptions().signals({SIGTERM, SIGUSR1}));
    const ProcessGroup group =
        init_process_group("127.0.0.1", port, rank, 2, ProcessGroupOptions().timeout(std::chrono::seconds(60)));
    std::string problem = check_agreement(notice, group, rank);
    before_leaving();
    return problem;
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Ranks 0 (this process) and 1 (a child) of one group over loopback, each with a notice of
// its own (one per process: signal dispositions are process-wide). Returns 0 if both saw
// what check_agreement() expects; says on stderr what went wrong.
int agree_over_two_processes() {
  const int port = stowage::testing::free_port();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 2;
  }
  if (child == 0) {
    const std::string problem = agree_as_rank(port, 1, [] {});
    if (!problem.empty()) std::fprintf(stderr, "rank 1: %s\n", problem.c_str());
    _exit(problem.empty() ? 0 : 1);
  }
  int status = -1;
  // Rank 0 hosts the store: it leaves once rank 1 has, so that no collective of rank 1's
  // loses its peer midway.
  const std::string problem = agree_as_rank(port, 0, [&] { waitpid(child, &status, 0); });
  if (status == -1) waitpid(child, &status, 0);  // rank 0 failed before it got there
  if (!problem.empty()) std::fprintf(stderr, "rank 0: %s\n", problem.c_str());
  return problem.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

class DistPreemption : public ::testing::Test {
 protected:
  // The death tests fork a process that runs the test binary afresh: other tests' threads
  // (c10d, LibTorch's pools) are not in it.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(DistPreemption, ASignalIsNoticeForTheLoopToRead) {
  PreemptionNotice notice(PreemptionOptions().signals({SIGTERM, SIGUSR1}));
  EXPECT_FALSE(notice.received());
  EXPECT_FALSE(notice.agreed(std::nullopt));
  std::raise(SIGUSR1);
  EXPECT_TRUE(notice.received());
  EXPECT_TRUE(notice.agreed(std::nullopt));
  EXPECT_EQ(notice.signal_number(), SIGUSR1);
  notice.notify(SIGTERM);  // notice is given once: the first signal stays
  EXPECT_EQ(notice.signal_number(), SIGUSR1);
}

TEST_F(DistPreemption, ThePreviousHandlersComeBack) {
  const auto before = handler_of(SIGTERM);
  {
    const PreemptionNotice notice;
    EXPECT_NE(handler_of(SIGTERM), before);
  }
  EXPECT_EQ(handler_of(SIGTERM), before);
  const PreemptionNotice again;  // and a new notice may be made
  EXPECT_FALSE(again.received());
}

TEST_F(DistPreemption, ASecondSignalEndsTheProcessAsTheSignalWould) {
  EXPECT_EXIT(
      {
        const PreemptionNotice notice;
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::this_thread::sleep_for(milliseconds(2000));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "a second preemption signal: exiting at once");
}

TEST_F(DistPreemption, WithoutSecondSignalExitsASecondSignalIsIgnored) {
  EXPECT_EXIT(
      {
        const PreemptionNotice notice(PreemptionOptions().second_signal_exits(false));
        std::raise(SIGTERM);
        std::raise(SIGTERM);
        std::exit(notice.signal_number() == SIGTERM ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(DistPreemption, TheGraceDeadlineEndsTheProcess) {
  EXPECT_EXIT(
      {
        const PreemptionNotice notice(PreemptionOptions().grace(milliseconds(100)));
        std::raise(SIGTERM);
        std::this_thread::sleep_for(milliseconds(20000));  // a save that hangs
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "the preemption grace of 0.1 s ran out");
}

// Judged by state, not by time: the deadline is an hour away, and disarm() must have
// ended the watchdog that would keep it (its thread is gone once disarm() returns), while
// a second signal, which would end an armed notice's process at once, is ignored.
TEST_F(DistPreemption, ADisarmedNoticeIgnoresSignalsAndItsDeadline) {
  EXPECT_EXIT(
      {
        const int64_t before = thread_count();
        PreemptionNotice notice(PreemptionOptions().grace(std::chrono::hours(1)));
        if (thread_count() != before + 1) {
          std::fprintf(stderr, "no watchdog thread: %lld threads, %lld before\n",
                       static_cast<long long>(thread_count()), static_cast<long long>(before));
          std::exit(3);
        }
        std::raise(SIGTERM);
        notice.disarm();
        std::raise(SIGTERM);
        if (thread_count() != before) {
          std::fprintf(stderr, "the watchdog outlived disarm(): %lld threads, %lld before\n",
                       static_cast<long long>(thread_count()), static_cast<long long>(before));
          std::exit(4);
        }
        std::exit(notice.signal_number() == SIGTERM ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(DistPreemption, OverAGroupEveryRankAgreesAtTheCallAfterOneRankGotNotice) {
  EXPECT_EXIT(std::exit(agree_over_two_processes()), ::testing::ExitedWithCode(0), "");
}

TEST_F(DistPreemption, BadOptionsAreRefusedByName) {
  try {
    const PreemptionNotice notice(PreemptionOptions().signals({SIGTERM, SIGKILL}));
    ADD_FAILURE() << "accepted SIGKILL";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("signal 9 cannot be caught"));
  }
  EXPECT_THROW(PreemptionNotice(PreemptionOptions().grace(milliseconds(-1))), InvalidArgument);
  const PreemptionNotice notice;
  try {
    const PreemptionNotice second;
    ADD_FAILURE() << "two notices at once";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("another one lives in this process"));
  }
}

}  // namespace
}  // namespace stowage::dist
