#pragma once

// `stowage train` runs in the background, and the ranks of a --nproc run as processes:
// for the tests that signal or kill them while they train (train_preempt_test.cpp,
// train_lost_node_test.cpp).

#include "cli/child_signal.h"
#include "cli/train_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace stowage::testing {

// The pids of the stowage processes whose command line names `run_dir` and whose
// environment has RANK (the ranks of a --nproc run), by rank.
inline std::map<int, pid_t> ranks_by_number(const std::string& run_dir) {
  std::map<int, pid_t> ranks;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline_file(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(cmdline_file)), std::istreambuf_iterator<char>());
    if (cmdline.find(run_dir) == std::string::npos || cmdline.find(stowage_binary()) != 0) continue;
    std::ifstream environ_file(entry.path() / "environ", std::ios::binary);
    for (std::string variable; std::getline(environ_file, variable, '\0');) {
      if (variable.rfind("RANK=", 0) == 0) ranks[std::stoi(variable.substr(5))] = static_cast<pid_t>(std::stoi(name));
    }
  }
  return ranks;
}

inline std::vector<pid_t> ranks_of(const std::string& run_dir) {
  std::vector<pid_t> pids;
  for (const auto& [rank, pid] : ranks_by_number(run_dir)) pids.push_back(pid);
  return pids;
}

// A `stowage train` run of `model` (kSmall's) and `args` in the background, its output in
// a file of its run directory's sibling.
class BackgroundTrain {
 public:
  BackgroundTrain(const RunDir& dir, const std::string& args, const std::string& model = kSmall)
      : run_dir_(dir.str()), log_(dir.str() + ".log") {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // its own process group: killed with it on a hang
      const std::string command =
          fmt::format("exec {} train --run-dir {}{} {} > {} 2>&1", stowage_binary(), dir.str(), model, args, log_);
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      status_ = 127;  // nothing to wait for, nor to signal
      return;
    }
    setpgid(pid_, pid_);  // here too, so that the group exists before any signal to it
  }
  ~BackgroundTrain() {
    if (status_ < 0) finish();
    std::filesystem::remove(log_);
  }

  // The launcher's pid: a child of this process until finish() has reaped it.
  pid_t pid() const { return pid_; }
  std::string output() const {
    std::ifstream file(log_);
    return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  }
  // Waits until `ready()` (true) or the run ends or two minutes pass (false).
  bool wait_until(const std::function<bool()>& ready) {
    if (status_ >= 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (std::chrono::steady_clock::now() < deadline) {
      if (ready()) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // The exit status, or 128 + signal; a run still going two minutes from now is a hang:
  // it is killed, with every process it started, and reported so.
  int finish() {
    if (status_ >= 0) return status_;
    if (!wait_until([] { return false; })) {
      if (status_ >= 0) return status_;
      // The ranks first, in a group of their own: once the launcher is gone they are no
      // longer this process's descendants, and would be refused.
      for (const pid_t rank : ranks_of(run_dir_)) EXPECT_TRUE(signal_descendant(rank, SIGKILL));
      EXPECT_TRUE(signal_descendant_group(pid_, SIGKILL));
      ADD_FAILURE() << "the run hung; its output:\n" << output();
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return status_;
  }

 private:
  std::string run_dir_;
  std::string log_;
  pid_t pid_ = -1;
  int status_ = -1;
};

}  // namespace stowage::testing
