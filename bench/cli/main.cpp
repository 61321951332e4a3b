// stowage-bench: the benchmarks of stowage, over bench/lib; `stowage bench ARGS` runs it.
#include "bench_commands.h"
#include "program.h"

int main(int argc, char** argv) {
  CLI::App app;
  stowage::cli::add_benchmarks(app);
  return stowage::cli::run_program(app, "stowage-bench", argc, argv);
}
