// bench_protocol [--json] [--steps N]: what train::Trainer's protocol costs a step
// (bench/lib/protocol_bench.h).

#include <emit.h>
#include <protocol_bench.h>

#include <fmt/format.h>

#include <cstring>
#include <string>

int main(int argc, char** argv) {
  stowage::bench::ProtocolBenchOptions options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      options.steps = std::stoll(argv[++i]);
    } else {
      fmt::print(stderr, "usage: bench_protocol [--json] [--steps N]\n");
      return 2;
    }
  }
  const auto result = stowage::bench::run_protocol_bench(options);
  stowage::bench::print_result(to_json(result), to_text(result), json);
  return 0;
}
