#include "launch_ranks.h"

#include <stowage/error.h>
#include <stowage/dist/preemption.h>

#include <fmt/format.h>

#include <netinet/in.h>
#include <sys/prctl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

namespace stowage::cli {
namespace {

// A port the kernel reports free now; rank 0's TCPStore binds it moments later.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("launch: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw Error("launch: cannot find a free port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// The signals launch passes on to its ranks, and the last one it got, for its loop to pass on.
constexpr int kForwardedSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
std::atomic<int> g_signal_to_forward{0};

extern "C" void remember_signal(int signal) {
  g_signal_to_forward = signal;
}

void forward_signals_to_ranks() {
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int signal : kForwardedSignals) sigaction(signal, &action, nullptr);
}

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::string executable_path() {
  std::error_code error;
  const std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw Error(fmt::format("cannot find this program's executable (/proc/self/exe): {}", error.message()));
  return path.string();
}

std::vector<std::string> own_command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(file, arg, '\0');) args.push_back(arg);
  if (args.empty()) throw Error("cannot read this process's command line (/proc/self/cmdline)");
  args[0] = executable_path();
  return args;
}

int launch_ranks(int nproc, int port, std::chrono::seconds grace, const std::vector<std::string>& command,
                 int nproc_per_node) {
  if (command.empty()) throw InvalidArgument("launch: no command given after --");
  if (nproc_per_node == 0) nproc_per_node = nproc;
  if (nproc_per_node < 0 || nproc % nproc_per_node != 0) {
    throw InvalidArgument(fmt::format("launch: --nproc-per-node {} does not divide --nproc {}", nproc_per_node, nproc));
  }
  if (port == 0) port = free_port();
  forward_signals_to_ranks();
  std::vector<pid_t> children;
  pid_t ranks_group = 0;  // the first rank's pid, once it runs
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw Error("launch: fork failed");
    if (pid == 0) {
      setpgid(0, ranks_group);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // out of launch's group: they must not outlive it
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank % nproc_per_node).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(rank / nproc_per_node).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc_per_node).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      argv.reserve(command.size() + 1);
      for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      fmt::print(stderr, "launch: cannot run '{}'\n", command[0]);
      _exit(127);
    }
    setpgid(pid, ranks_group);  // here too: either call may run first
    if (ranks_group == 0) ranks_group = pid;
    children.push_back(pid);
  }
  int result = 0;
  size_t running = children.size();
  bool stopping = false;
  std::chrono::steady_clock::time_point kill_at;
  while (running > 0) {
    if (const int signal = g_signal_to_forward.exchange(0); signal != 0) {
      for (const pid_t child : children) {
        if (child > 0) kill(child, signal);
      }
    }
    int status = 0;
    // Polled, so that a signal to pass on is never left waiting for a rank to exit.
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --running;
      const int code = exit_status(status);
      for (size_t rank = 0; rank < children.size(); ++rank) {
        if (children[rank] != pid) continue;
        children[rank] = -1;
        if (result == 0) result = code;
        if (code != 0 && code != dist::kPreemptedStatus && !stopping) {
          fmt::print(stderr, "launch: rank {} exited with status {}; stopping the other ranks\n", rank, code);
          result = code;
          stopping = true;
          kill_at = std::chrono::steady_clock::now() + grace;
          for (const pid_t other : children) {
            if (other > 0) kill(other, SIGTERM);
          }
        }
      }
    } else {
      if (stopping && std::chrono::steady_clock::now() >= kill_at) {
        for (const pid_t other : children) {
          if (other > 0) kill(other, SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return result;
}

}  // namespace stowage::cli
