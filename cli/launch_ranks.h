#pragma once

// Local ranks of a command, started as torchrun starts them: each with RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (`stowage launch`,
// `stowage train --nproc`, and the benchmarks that run ranks of themselves).
//
// Like torchrun, the first rank to fail brings the others down: they get SIGTERM, then
// SIGKILL after a grace period, and the failed rank's status is returned. And like
// torchrun, a signal a scheduler sends to the launching process (TERM, INT, HUP, USR1,
// USR2) goes on to every rank, which decide what to do with it (`stowage train` saves and
// exits). The ranks have a process group of their own, so that a signal to the launcher's
// group (a terminal's Ctrl-C, `kill -TERM -<group>`) reaches each rank once, through the
// launcher: a rank that got it twice would take the second for a second notice.

#include <chrono>
#include <string>
#include <vector>

namespace stowage::cli {

// Runs `command` as ranks 0..nproc-1 with torchrun's environment (port 0: a free one),
// `nproc_per_node` to a node (0: all on one): rank R is local rank R mod nproc_per_node of
// node (GROUP_RANK) R / nproc_per_node, as torchrun numbers them. Returns the first failed
// rank's exit status, or 0. Throws InvalidArgument when nproc_per_node does not divide nproc.
int launch_ranks(int nproc, int port, std::chrono::seconds grace, const std::vector<std::string>& command,
                 int nproc_per_node = 0);

// The absolute path of this executable, to start it again as ranks.
std::string executable_path();

// This process's command line, with executable_path() first: to start it again as ranks.
std::vector<std::string> own_command_line();

}  // namespace stowage::cli
