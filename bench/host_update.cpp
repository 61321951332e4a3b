// bench_host_update [--json] [--params N] [--threads T] [--peer]: one AdamW step of one
// fp32 tensor on the host by LibTorch's AdamW, stowage's FusedAdamW and (--peer) PyTorch's
// fused CPU AdamW, against the memory's floor (bench/lib/host_update_bench.h).

#include <emit.h>
#include <host_update_bench.h>
#include <python_peer.h>

#include <fmt/format.h>

#include <cstring>
#include <string>

int main(int argc, char** argv) {
  stowage::bench::HostUpdateBenchOptions options;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--peer") == 0) {
      options.peer = true;
    } else if (std::strcmp(argv[i], "--params") == 0 && i + 1 < argc) {
      options.params = std::stoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      options.threads = std::stoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: bench_host_update [--json] [--params N] [--threads T] [--peer]\n");
      return 2;
    }
  }
  if (options.peer && !stowage::bench::python_peer_available()) {
    fmt::print(stderr, "bench_host_update: --peer: {}\n", stowage::bench::python_peer_unavailable_reason());
    return 2;
  }
  if (options.params <= 0 || options.threads <= 0) {
    fmt::print(stderr, "bench_host_update: --params and --threads must be positive\n");
    return 2;
  }
  const auto result = stowage::bench::run_host_update_bench(options);
  stowage::bench::print_result(to_json(result), to_text(result), json);
  return 0;
}
