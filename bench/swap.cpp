// bench_swap [--json] [--params N]: the same benchmark as `stowage bench swap`.

#include <emit.h>
#include <swap_bench.h>

#include <fmt/format.h>

#include <cstring>
#include <string>

int main(int argc, char** argv) {
  stowage::bench::SwapBenchOptions options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--params") == 0 && i + 1 < argc) {
      options.params = std::stoll(argv[++i]);
    } else {
      fmt::print(stderr, "usage: bench_swap [--json] [--params N]\n");
      return 2;
    }
  }
  const auto result = stowage::bench::run_swap_bench(options);
  stowage::bench::print_result(to_json(result), to_text(result), json);
  return 0;
}
