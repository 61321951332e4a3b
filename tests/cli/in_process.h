#pragma once

// Command lines run as the built programs run them, but in the test's own process: the
// programs' own command lines (add_commands, add_benchmarks) and run_program, without
// starting a LibTorch process for each (~0.4 s).

#include "cli/cli_util.h"

#include "bench_commands.h"
#include "commands.h"
#include "program.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace stowage::testing {

// `command_line` (words split at spaces, no quoting) as `stowage` runs it, `bench ...` as
// stowage-bench, which it runs: the status the program would exit with, and what it
// printed on stdout and stderr.
inline CommandResult run_in_process(const std::string& command_line) {
  std::vector<std::string> words;
  std::istringstream split(command_line);
  for (std::string word; split >> word;) words.push_back(word);
  CLI::App app;
  const bool bench = !words.empty() && words.front() == "bench";
  if (bench) {
    cli::add_benchmarks(app);
  } else {
    cli::add_commands(app);
  }
  const char* program = bench ? "stowage-bench" : "stowage";
  std::vector<char*> argv{const_cast<char*>(program)};
  for (size_t i = bench ? 1 : 0; i < words.size(); ++i) argv.push_back(words[i].data());
  CommandResult result;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  result.status = cli::run_program(app, program, static_cast<int>(argv.size()), argv.data());
  result.output = ::testing::internal::GetCapturedStdout() + ::testing::internal::GetCapturedStderr();
  return result;
}

}  // namespace stowage::testing
