#include "commands.h"

namespace stowage::cli {

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Run a benchmark and print its figures");
  bench->require_subcommand(1);
  add_bench_activation(*bench);
  add_bench_swap(*bench);
  add_bench_dcp(*bench);
}

}  // namespace stowage::cli
