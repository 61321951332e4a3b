#include "commands.h"

#include <stowage/error.h>
#include <stowage/build_info.h>

#include <c10/util/Exception.h>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"stowage: train models larger than device memory, checkpoint without stalling"};
  // A callback, not a fixed string: the CUDA line counts the devices visible now.
  app.set_version_flag("--version", [] { return stowage::describe_build(); });
  app.require_subcommand(1);
  stowage::cli::add_launch_command(app);
  stowage::cli::add_train_command(app);
  stowage::cli::add_ckpt_command(app);
  stowage::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own status (train's 75), not an argument's
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad argument 2, as a usage error (CLI11's own
    // codes, 100 and up, would read as a command's status).
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const stowage::Error& e) {
    std::cerr << "stowage: " << e.what() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "stowage: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {  // e.g. std::filesystem's errors, which name the path
    std::cerr << "stowage: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
