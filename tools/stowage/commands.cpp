#include "commands.h"

#include <stowage/build_info.h>

namespace stowage::cli {

void add_commands(CLI::App& app) {
  app.description("stowage: train models larger than device memory, checkpoint without stalling");
  // A callback, not a fixed string: the CUDA line counts the devices visible now.
  app.set_version_flag("--version", [] { return stowage::describe_build(); });
  app.require_subcommand(1);
  add_launch_command(app);
  add_train_command(app);
  add_ckpt_command(app);
  add_bench_command(app);
}

}  // namespace stowage::cli
