#pragma once

// A program run as a child process, its output into a file: the benchmarks that measure
// the real `stowage train` from outside (train_run.h).

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

}  // namespace stowage::cli
