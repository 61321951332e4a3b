#pragma once

// Each subcommand of the stowage tool lives in its own file and registers itself here.

#include <CLI/CLI.hpp>

namespace stowage::cli {

// The tool's whole command line (what `stowage` parses): --version and the four commands,
// one of which must be named.
void add_commands(CLI::App& app);

void add_launch_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
// `stowage bench ...`: runs the benchmarks' program, stowage-bench, beside this one.
void add_bench_command(CLI::App& app);

}  // namespace stowage::cli
