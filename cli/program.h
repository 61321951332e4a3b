#pragma once

// How the stowage programs (`stowage`, `stowage-bench`) run their command line, and the
// statuses they exit with.

#include <CLI/CLI.hpp>

namespace stowage::cli {

// The status a program exits with when a device ran out of memory (c10::OutOfMemoryError),
// so that a caller tells a model too large for the device from any other failure.
inline constexpr int kOutOfMemoryStatus = 3;

// Parses `argv` with `app`, which runs the command it names, and returns the exit status:
// 0; the status a command ended with (a CLI::RuntimeError's, e.g. `stowage train`'s 75);
// 2 for a bad argument (0 for --help and --version); kOutOfMemoryStatus; 1 for any other
// error, printed on stderr after "<program>: ".
int run_program(CLI::App& app, const char* program, int argc, char** argv);

}  // namespace stowage::cli
