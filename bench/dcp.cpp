// bench_dcp [size_mib] [dir]: the dcp benchmark as a standalone executable; prints
// the report and the JSON object that `stowage bench dcp --json` prints.
// bench_dcp small [entries] [turns] [dir]: many small entries (default 100,000, 3 turns)
// against torch::save/torch::load, and the metadata's size.

#include "dcp_bench.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "small") {
      const int64_t entries = argc > 2 ? std::atoll(argv[2]) : 100000;
      const int turns = argc > 3 ? std::atoi(argv[3]) : 3;
      const auto result = stowage::bench::run_small_entries_bench(entries, turns, argc > 4 ? argv[4] : "");
      std::fputs(stowage::bench::to_text(result).c_str(), stdout);
      std::puts(stowage::bench::to_json(result).dump().c_str());
      return 0;
    }
    stowage::bench::DcpBenchOptions options;
    if (argc > 1) options.size_mib = std::atoll(argv[1]);
    if (argc > 2) options.dir = argv[2];
    const auto result = stowage::bench::run_dcp_bench(options);
    std::fputs(stowage::bench::to_text(result).c_str(), stdout);
    std::puts(stowage::bench::to_json(result).dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dcp: %s\n", e.what());
    return 1;
  }
  return 0;
}
