#pragma once

// Each subcommand of the stowage tool lives in its own file and registers itself here.

#include <CLI/CLI.hpp>
#include <c10/core/Device.h>

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
void add_bench_grad_sync(CLI::App& bench);
void add_bench_interop(CLI::App& bench);
void add_bench_train(CLI::App& bench);
void add_bench_capacity(CLI::App& bench);

// Runs `command` as ranks 0..nproc-1 with torchrun's environment (port 0: a free one);
// returns the first failed rank's exit status, or 0.
int launch_ranks(int nproc, int port, std::chrono::seconds grace, const std::vector<std::string>& command);
// The absolute path of this executable, to start it again as ranks.
std::string executable_path();
// This process's command line, with executable_path() first: to start it again as ranks.
std::vector<std::string> own_command_line();

// The device of a --device option ("cpu", "cuda", "cuda:1"). Throws InvalidArgument naming
// the text when it is no device, or one this build or machine does not have.
c10::Device parse_device(const std::string& text);

}  // namespace stowage::cli
