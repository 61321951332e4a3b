#pragma once

// The subcommands of stowage-bench (also run as `stowage bench`), each in its own file.

#include <CLI/CLI.hpp>

namespace stowage::cli {

// stowage-bench's whole command line: a benchmark's subcommand, or none for them all.
void add_benchmarks(CLI::App& bench);

// Without a subcommand: every benchmark, one table of their targets, and the report.
void add_run_all(CLI::App& bench);
void add_bench_activation(CLI::App& bench);
void add_bench_swap(CLI::App& bench);
void add_bench_dcp(CLI::App& bench);
void add_bench_grad_sync(CLI::App& bench);
void add_bench_interop(CLI::App& bench);
void add_bench_train(CLI::App& bench);
void add_bench_capacity(CLI::App& bench);
void add_bench_memory_tier(CLI::App& bench);

}  // namespace stowage::cli
