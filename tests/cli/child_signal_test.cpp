// The tests' one way to signal a process (cli/child_signal.h): it refuses every pid that
// kill(2) would take for a group or for every process, and every process this test did
// not start, and signals the ones it did.

#include "cli/child_signal.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace stowage::testing {
namespace {

// A child that sleeps until it is signalled (a minute at most), in a process group of its
// own if `own_group`.
pid_t sleeping_child(bool own_group = false) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (own_group) setpgid(0, 0);
    execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid > 0 && own_group) setpgid(pid, pid);  // either call may run first
  return pid;
}

int reaped_signal(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFSIGNALED(status)) return 0;
  return WTERMSIG(status);
}

TEST(ChildSignal, RefusesGroupsEveryProcessAndProcessesTheTestDidNotStart) {
  for (const pid_t pid : {pid_t{0}, pid_t{-1}, pid_t{-2}, getpid(), getppid(), pid_t{1}}) {
    const ::testing::AssertionResult sent = signal_descendant(pid, 0);  // signal 0: nothing is delivered
    EXPECT_FALSE(sent) << "pid " << pid;
    EXPECT_NE(std::string(sent.message()).find("refused"), std::string::npos) << sent.message();
    EXPECT_FALSE(signal_descendant_group(pid, 0)) << "group of pid " << pid;
  }
}

TEST(ChildSignal, SignalsAChildAndAChildsChild) {
  const pid_t child = sleeping_child();
  ASSERT_GT(child, 0);
  ASSERT_TRUE(signal_descendant(child, SIGTERM));
  EXPECT_EQ(reaped_signal(child), SIGTERM);

  // A shell that starts a sleep of its own: the grandchild is this test's too.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t shell = fork();
  if (shell == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    execl("/bin/sh", "sh", "-c", "sleep 60 & echo $!; wait", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(pipe_fds[1]);
  char line[32] = {};
  ASSERT_GT(read(pipe_fds[0], line, sizeof(line) - 1), 0);
  close(pipe_fds[0]);
  const pid_t grandchild = static_cast<pid_t>(std::stol(line));
  EXPECT_TRUE(is_descendant(grandchild));
  ASSERT_TRUE(signal_descendant(grandchild, SIGKILL));
  ASSERT_TRUE(signal_descendant(shell, SIGKILL));
  EXPECT_EQ(reaped_signal(shell), SIGKILL);
}

TEST(ChildSignal, SignalsTheGroupOfAChildThatLeadsOneAndNoOtherGroup) {
  const pid_t member = sleeping_child();  // in this test's group, which it does not lead
  ASSERT_GT(member, 0);
  EXPECT_FALSE(signal_descendant_group(member, SIGTERM));
  ASSERT_TRUE(signal_descendant(member, SIGKILL));
  EXPECT_EQ(reaped_signal(member), SIGKILL);

  const pid_t leader = sleeping_child(/*own_group=*/true);
  ASSERT_GT(leader, 0);
  ASSERT_TRUE(signal_descendant_group(leader, SIGTERM));
  EXPECT_EQ(reaped_signal(leader), SIGTERM);
}

}  // namespace
}  // namespace stowage::testing
