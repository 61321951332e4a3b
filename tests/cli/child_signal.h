#pragma once

// Signals for the processes a test started, and for nothing else: kill(2) with a pid of
// 0 or -1 signals the test's own process group or every process the user may signal
// (CI runs as root), and a stale pid may by now name someone else's process. Every test
// signals through these calls, which refuse all of that and say why; ASSERT on them.

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace stowage::testing {

// The parent of `pid` as /proc says, or -1 if there is no such process.
inline pid_t parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, the last ')' ends it.
  const size_t after_name = line.rfind(')');
  if (after_name == std::string::npos) return -1;
  std::istringstream fields(line.substr(after_name + 1));
  char state = 0;
  pid_t parent = -1;
  fields >> state >> parent;
  return fields ? parent : -1;
}

// Whether `pid` is a live (or not yet reaped) descendant of this test process.
inline bool is_descendant(pid_t pid) {
  if (pid <= 0) return false;
  const pid_t self = getpid();
  for (pid_t at = pid; at > 1;) {
    const pid_t parent = parent_of(at);
    if (parent == self) return true;
    if (parent <= 0 || parent == at) return false;
    at = parent;
  }
  return false;
}

// Sends `signal` to `pid`, a process this test started (a child, or a child's child such
// as a rank of `stowage train --nproc`). Refuses a pid <= 0 and a pid that is not a
// descendant of this process.
// REQUIRES: the caller has not reaped `pid` (its number may have been reused since).
inline ::testing::AssertionResult signal_descendant(pid_t pid, int signal) {
  if (pid <= 0) {
    return ::testing::AssertionFailure() << "refused to send signal " << signal << " to pid " << pid
                                         << " (0 and below name process groups or every process)";
  }
  if (!is_descendant(pid)) {
    return ::testing::AssertionFailure() << "refused to send signal " << signal << " to pid " << pid
                                         << ": not a process this test started";
  }
  if (::kill(pid, signal) != 0) {
    return ::testing::AssertionFailure() << "kill(" << pid << ", " << signal << "): " << std::strerror(errno);
  }
  return ::testing::AssertionSuccess();
}

// Sends `signal` to the process group that `leader`, a process this test started, leads.
// Refuses a leader <= 0, one that is not a descendant and one that leads no group of its
// own (the group would then be someone else's, perhaps the test's).
// REQUIRES: the caller has not reaped `leader`.
inline ::testing::AssertionResult signal_descendant_group(pid_t leader, int signal) {
  if (leader <= 0 || !is_descendant(leader)) return signal_descendant(leader, signal);  // says why
  if (getpgid(leader) != leader) {
    return ::testing::AssertionFailure() << "refused to send signal " << signal << " to the group of pid " << leader
                                         << ": it leads no process group of its own";
  }
  if (::kill(-leader, signal) != 0) {
    return ::testing::AssertionFailure() << "kill(-" << leader << ", " << signal << "): " << std::strerror(errno);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace stowage::testing
