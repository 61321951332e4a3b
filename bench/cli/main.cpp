// stowage-bench: the benchmarks of stowage, over bench/lib; `stowage bench ARGS` runs it.
#include "commands.h"
#include "program.h"

int main(int argc, char** argv) {
  CLI::App app{"Run one benchmark, or all of them (one table) without a name"};
  app.require_subcommand(0, 1);
  stowage::cli::add_run_all(app);
  stowage::cli::add_bench_activation(app);
  stowage::cli::add_bench_swap(app);
  stowage::cli::add_bench_dcp(app);
  stowage::cli::add_bench_grad_sync(app);
  stowage::cli::add_bench_interop(app);
  stowage::cli::add_bench_train(app);
  stowage::cli::add_bench_capacity(app);
  stowage::cli::add_bench_memory_tier(app);
  return stowage::cli::run_program(app, "stowage-bench", argc, argv);
}
