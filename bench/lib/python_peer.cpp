#include "python_peer.h"

#include "bench_paths.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace stowage::bench {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

bool python_peer_available() {
  return !paths::python().empty() && !paths::peer_scripts().empty();
}

std::string python_peer_unavailable_reason() {
  return "--peer needs the torch wheel's Python, and this stowage was built without one (on Debian's LibTorch "
         "1.13.1): build it with `bash scripts/build.sh wheel` and run build-wheel/stowage";
}

PythonPeer::PythonPeer(const std::string& script, const std::vector<std::string>& args) : script_(script) {
  if (!python_peer_available()) throw Error(python_peer_unavailable_reason());
  const std::string path = paths::peer_scripts() + "/" + script;
  std::vector<std::string> argv_strings{paths::python(), "-u", path};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) fail(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]);
    ::close(to_child[1]);
    fail(fmt::format("cannot make a pipe: {}", std::strerror(errno)));
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    // The child: only async-signal-safe calls until exec.
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  to_script_ = to_child[1];
  from_script_ = from_child[0];
  if (pid_ < 0) fail(fmt::format("cannot fork: {}", std::strerror(errno)));
}

PythonPeer::~PythonPeer() {
  close_fd(to_script_);
  close_fd(from_script_);
  if (pid_ > 0) {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void PythonPeer::fail(const std::string& what) {
  throw Error(fmt::format("Python peer bench/peer/{} ({}): {}", script_, paths::python(), what));
}

nlohmann::json PythonPeer::request(const nlohmann::json& request) {
  // A script that died must not kill the benchmark with SIGPIPE: the write reports it.
  struct sigaction ignore {};
  struct sigaction previous {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);
  const std::string line = request.dump() + "\n";
  bool written = true;
  for (size_t done = 0; written && done < line.size();) {
    const ssize_t n = ::write(to_script_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    written = n > 0;
    if (written) done += static_cast<size_t>(n);
  }
  ::sigaction(SIGPIPE, &previous, nullptr);
  if (!written) fail("it exited before taking a request (its error is above)");

  size_t newline;
  while ((newline = pending_.find('\n')) == std::string::npos) {
    char buffer[4096];
    const ssize_t n = ::read(from_script_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("it exited without answering (its error is above)");
    pending_.append(buffer, static_cast<size_t>(n));
  }
  const std::string answer_line = pending_.substr(0, newline);
  pending_.erase(0, newline + 1);
  nlohmann::json answer = nlohmann::json::parse(answer_line, nullptr, /*allow_exceptions=*/false);
  if (!answer.is_object()) fail(fmt::format("it answered '{}', which is no JSON object", answer_line.substr(0, 200)));
  if (answer.contains("error")) fail(fmt::format("it failed: {}", answer["error"].dump()));
  return answer;
}

}  // namespace stowage::bench
