#pragma once

// Running this tool again as a child process, for the benchmarks that measure the real
// command (`stowage train`) from outside.

#include <map>
#include <string>
#include <vector>

namespace stowage::cli {

struct ChildRun {
  int status = 0;      // as waitpid reports it
  std::string output;  // stdout and stderr, interleaved
  bool succeeded() const;
  // The end of the output (its last 2000 characters), for an error message.
  std::string output_tail() const;
};

// Runs `args` (args[0] an executable's path) with stdout and stderr into the file `log`,
// with this process's environment plus `environment` (which replaces variables of the
// same name), and waits for it. Throws stowage::Error when it cannot be started.
ChildRun run_child(const std::vector<std::string>& args, const std::string& log,
                   const std::map<std::string, std::string>& environment = {});

// run_child, for a run that must succeed: returns its output, or throws stowage::Error
// "<what> failed (status N): <output_tail()>".
std::string run_child_or_throw(const std::vector<std::string>& args, const std::string& log, const std::string& what);

}  // namespace stowage::cli
