// bench_dcp [size_mib] [dir]: the dcp benchmark as a standalone executable; prints
// the report and the JSON object that `stowage bench dcp --json` prints.

#include "dcp_bench.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  stowage::bench::DcpBenchOptions options;
  if (argc > 1) options.size_mib = std::atoll(argv[1]);
  if (argc > 2) options.dir = argv[2];
  try {
    const auto result = stowage::bench::run_dcp_bench(options);
    std::fputs(stowage::bench::to_text(result).c_str(), stdout);
    std::puts(stowage::bench::to_json(result).dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dcp: %s\n", e.what());
    return 1;
  }
  return 0;
}
