// `stowage launch --nproc N -- <command>`: runs N local copies of a command with the
// environment torchrun gives each rank (launch_ranks.h), so multi-process jobs run
// without Python.
#include "cli_numbers.h"
#include "commands.h"
#include "launch_ranks.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace stowage::cli {

void add_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("launch", "Run N local ranks of a command with torchrun's environment");
  struct Options {
    int nproc = 1;
    int nproc_per_node = 0;
    int port = 0;
    int grace_s = 10;
    std::vector<std::string> command;
  };
  auto options = std::make_shared<Options>();
  cmd->add_option("--nproc", options->nproc, "number of ranks")->check(integer_in(1, 1024));
  cmd->add_option("--nproc-per-node", options->nproc_per_node,
                  "ranks per node (GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE as torchrun sets them), for several "
                  "\"nodes\" on this machine; 0: all on one")
      ->check(integer_in(0, 1024));
  cmd->add_option("--master-port", options->port, "rendezvous port (default: a free one)")->check(integer_in(0, 65535));
  cmd->add_option("--grace", options->grace_s,
                  "seconds between SIGTERM and SIGKILL for the other ranks after a failure")
      ->check(non_negative_integer<int>());
  cmd->add_option("command", options->command, "the command to run, after --")->required();
  cmd->callback([options] {
    const int code = launch_ranks(options->nproc, options->port, std::chrono::seconds(options->grace_s),
                                  options->command, options->nproc_per_node);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace stowage::cli
