#pragma once

// The Python peers of the benchmarks: scripts in bench/peer/ that measure PyTorch's own
// tools (torch.distributed.checkpoint, torch.utils.checkpoint, a plain training loop) on
// the work a stowage benchmark measures, run by the Python of the torch wheel's
// environment this build was configured with (CMake's STOWAGE_PYTHON).
//
// A peer is one long-lived process, so that its rounds can take turns with stowage's
// (bench_util.h's take_turns) without paying Python's start-up each round. The protocol
// is one JSON object per line: the benchmark writes a request to the script's stdin, the
// script answers with one line on its stdout; the script's stderr is the benchmark's.
// Closing stdin ends the script.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include <sys/types.h>

namespace stowage::bench {

// Whether this build has a Python to run the peers with.
bool python_peer_available();

// The one-line reason a `--peer` run cannot run in this build, for the CLI to print.
std::string python_peer_unavailable_reason();

class PythonPeer {
 public:
  // Starts bench/peer/<script> with `args`. Throws stowage::Error when this build has no
  // Python (python_peer_available()) or the script cannot be started.
  PythonPeer(const std::string& script, const std::vector<std::string>& args);
  // Closes the script's stdin and waits for it to exit.
  ~PythonPeer();
  PythonPeer(const PythonPeer&) = delete;
  PythonPeer& operator=(const PythonPeer&) = delete;

  // Sends `request` and returns the script's answer. Throws stowage::Error naming the
  // script when it exits, or answers with something that is no JSON object, or with an
  // object that has an "error" field (the script's own failure).
  nlohmann::json request(const nlohmann::json& request);

 private:
  [[noreturn]] void fail(const std::string& what);

  std::string script_;
  pid_t pid_ = -1;
  int to_script_ = -1;
  int from_script_ = -1;
  std::string pending_;  // bytes read past the last answer's newline
};

}  // namespace stowage::bench
