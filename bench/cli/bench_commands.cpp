#include "bench_commands.h"

namespace stowage::cli {

void add_benchmarks(CLI::App& bench) {
  bench.description("Run one benchmark, or all of them (one table) without a name");
  bench.require_subcommand(0, 1);
  add_run_all(bench);
  add_bench_activation(bench);
  add_bench_swap(bench);
  add_bench_dcp(bench);
  add_bench_grad_sync(bench);
  add_bench_interop(bench);
  add_bench_train(bench);
  add_bench_capacity(bench);
  add_bench_memory_tier(bench);
}

}  // namespace stowage::cli
