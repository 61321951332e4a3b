#pragma once

// Runs the built `stowage` tool as a real child process.

#include "build_paths.h"
#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>
#include <string>

namespace stowage::testing {

struct CommandResult {
  int status = -1;     // exit status, or 128 + signal
  std::string output;  // stdout and stderr
};

inline std::string stowage_binary() {
  return test_paths::binary_dir() + "/stowage";
}

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// The Python this build runs its benchmark peers with (test_paths::python(), the torch
// wheel's); empty for a build on Debian's LibTorch.
inline std::string peer_python() {
  return test_paths::python();
}

// The JSON object a command printed: from the first line that opens one to the end
// (LibTorch and a peer's Python may print warnings before it); null if there is none.
inline nlohmann::json json_in_output(const std::string& output) {
  const size_t start = output.rfind('{', 0) == 0 ? 0 : output.find("\n{");
  if (start == std::string::npos) return nullptr;
  return nlohmann::json::parse(output.substr(start), nullptr, /*allow_exceptions=*/false);
}

// A benchmark's --json object: the last line of `output` that starts one (LibTorch may
// log before and after it).
inline std::string last_json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string last;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  return last;
}

}  // namespace stowage::testing
