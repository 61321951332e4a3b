// bench_activation: the activation-checkpointing benchmark (also `stowage bench activation`).
// Usage: bench_activation [--json]

#include "activation_bench.h"
#include "emit.h"

#include <fmt/format.h>

#include <cstring>
#include <exception>

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  try {
    const auto result = stowage::bench::run_activation_bench({});
    stowage::bench::print_result(stowage::bench::to_json(result), stowage::bench::to_text(result), json);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_activation: {}\n", e.what());
    return 1;
  }
  return 0;
}
