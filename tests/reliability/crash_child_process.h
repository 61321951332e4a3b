#pragma once

// A crash-trial child (crash_child.cpp) run by a test: its stdout read line by line, and
// SIGKILL at the moment the test picks (crash_test.cpp, memory_tier_crash_test.cpp).

#include "cli/child_signal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace stowage::reliability {

using Clock = std::chrono::steady_clock;

// A running crash_child and the lines it printed.
class CrashChild {
 public:
  // `extra_environment`: "NAME=VALUE" entries added to this process's environment.
  explicit CrashChild(const std::vector<std::string>& args, const std::vector<std::string>& extra_environment = {}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** entry = environ; *entry != nullptr; ++entry) envp.push_back(*entry);
    for (const std::string& entry : extra_environment) envp.push_back(const_cast<char*>(entry.c_str()));
    envp.push_back(nullptr);
    const int error = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    read_fd_ = fds[0];
    if (error != 0) throw std::runtime_error(std::string("posix_spawn failed: ") + std::strerror(error));
  }
  ~CrashChild() {
    if (pid_ > 0) kill_and_reap();
    ::close(read_fd_);
  }
  CrashChild(const CrashChild&) = delete;
  CrashChild& operator=(const CrashChild&) = delete;

  // The next line, or nullopt when `deadline` passes or the child closed its stdout.
  std::optional<std::string> next_line(Clock::time_point deadline) {
    for (;;) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0 || closed_) return std::nullopt;
      pollfd p{read_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[256];
      const ssize_t n = ::read(read_fd_, chunk, sizeof chunk);
      if (n <= 0) {
        closed_ = true;
      } else {
        buffer_.append(chunk, static_cast<size_t>(n));
      }
    }
  }

  // SIGKILL, then wait for it; returns its wait status.
  int kill_and_reap() {
    if (pid_ <= 0) return 0;  // reaped already
    EXPECT_TRUE(stowage::testing::signal_descendant(pid_, SIGKILL));
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int read_fd_ = -1;
  std::string buffer_;
  bool closed_ = false;
};

}  // namespace stowage::reliability
