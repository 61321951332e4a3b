#pragma once

// Each subcommand of the stowage tool lives in its own file and registers itself here.

#include <CLI/CLI.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace stowage::cli {

void add_launch_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
// `stowage bench <name>`: every benchmark registers a subcommand of `bench`.
void add_bench_command(CLI::App& app);
void add_bench_activation(CLI::App& bench);
void add_bench_swap(CLI::App& bench);
void add_bench_dcp(CLI::App& bench);

// Runs `command` as ranks 0..nproc-1 with torchrun's environment (port 0: a free one);
// returns the first failed rank's exit status, or 0.
int launch_ranks(int nproc, int port, std::chrono::seconds grace, const std::vector<std::string>& command);
// The absolute path of this executable, to start it again as ranks.
std::string executable_path();

}  // namespace stowage::cli
