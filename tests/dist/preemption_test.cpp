// dist::PreemptionNotice with real signals: a notice signal is kept for the loop to
// read, a second one or the grace deadline ends the process as the signal would, a
// disarmed notice ignores both, and the previous handlers come back. The ones that end
// the process run as death tests (a child process).

#include <stowage/dist/preemption.h>
#include <stowage/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
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

TEST_F(DistPreemption, ADisarmedNoticeIgnoresSignalsAndItsDeadline) {
  EXPECT_EXIT(
      {
        PreemptionNotice notice(PreemptionOptions().grace(milliseconds(50)));
        std::raise(SIGTERM);
        notice.disarm();
        std::raise(SIGTERM);
        std::this_thread::sleep_for(milliseconds(300));
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
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
