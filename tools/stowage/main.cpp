#include "commands.h"
#include "program.h"

#include <stowage/build_info.h>

int main(int argc, char** argv) {
  CLI::App app{"stowage: train models larger than device memory, checkpoint without stalling"};
  // A callback, not a fixed string: the CUDA line counts the devices visible now.
  app.set_version_flag("--version", [] { return stowage::describe_build(); });
  app.require_subcommand(1);
  stowage::cli::add_launch_command(app);
  stowage::cli::add_train_command(app);
  stowage::cli::add_ckpt_command(app);
  stowage::cli::add_bench_command(app);
  return stowage::cli::run_program(app, "stowage", argc, argv);
}
