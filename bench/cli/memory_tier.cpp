// `stowage bench memory-tier`: the memory tier's save and recovery against storage's, on
// --nproc local ranks acting as nodes of --nproc-per-node ranks (memory_tier_bench.h).
#include "cli_numbers.h"
#include "bench_commands.h"
#include "launch_ranks.h"

#include <bench_util.h>
#include <emit.h>
#include <memory_tier_bench.h>

#include <stowage/dist/process_group.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <fstream>

namespace stowage::cli {
namespace {

struct MemoryTierCommand {
  bench::MemoryTierBenchOptions options;
  int nproc = 2;
  int nproc_per_node = 1;
  bool json = false;
  // Internal: how the ranks are run.
  bool as_rank = false;
  std::string memory_root;   // the job's tier directory
  std::string storage_root;  // the job's storage directory
  std::string result_file;   // where rank 0 writes its result
};

// The tier's and the storage's directories, each a fresh one removed afterwards, and the
// ranks of this tool over them; rank 0's result.
bench::MemoryTierBenchResult run_ranks(const MemoryTierCommand& command) {
  const bench::MemoryTierBenchOptions& o = command.options;
  const bench::Scratch memory(o.memory_dir.empty() ? "/dev/shm" : o.memory_dir, "memory-tier");
  const bench::Scratch storage(o.storage_dir, "memory-tier-storage");
  const std::string result_file = storage.sub("result.json");
  std::vector<std::string> argv{executable_path(),
                                "memory-tier",
                                "--as-rank",
                                "--memory-root",
                                memory.path(),
                                "--storage-root",
                                storage.sub("checkpoints"),
                                "--result-file",
                                result_file,
                                "--size-mib",
                                std::to_string(o.size_mib),
                                "--tensors",
                                std::to_string(o.tensors),
                                "--rounds",
                                std::to_string(o.rounds),
                                "--storage-every",
                                std::to_string(o.storage_every),
                                "--memory-every"};
  for (const int64_t every : o.memory_every) argv.push_back(std::to_string(every));
  const int status = launch_ranks(command.nproc, 0, std::chrono::seconds(10), argv, command.nproc_per_node);
  std::ifstream in(result_file);
  const nlohmann::json result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (status != 0 || result.is_discarded()) {
    throw Error(fmt::format("bench memory-tier: the {}-rank run failed (status {})", command.nproc, status));
  }
  return bench::memory_tier_result_from_json(result);
}

}  // namespace

void add_bench_memory_tier(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "memory-tier",
      "The memory tier (host memory, replicated to a peer node) against storage: save throughput, recovery from "
      "memory, a peer's replica and cold storage, steps lost per failure, host bytes held");
  auto command = std::make_shared<MemoryTierCommand>();
  bench::MemoryTierBenchOptions& o = command->options;
  cmd->add_option("--size-mib", o.size_mib, "each rank's state in MiB")
      ->check(integer_in<int64_t>(1, std::numeric_limits<int64_t>::max() >> 20))
      ->capture_default_str();
  cmd->add_option("--tensors", o.tensors, "float tensors the state is split into")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "saves and restores of each kind (medians)")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--nproc", command->nproc, "local ranks (processes, c10d Gloo)")
      ->check(integer_in(2, 64))
      ->capture_default_str();
  cmd->add_option("--nproc-per-node", command->nproc_per_node,
                  "ranks per node (GROUP_RANK, LOCAL_WORLD_SIZE as torchrun sets them); --nproc / this >= 2 nodes")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--storage-dir", o.storage_dir,
                  "the storage's parent directory (default: the system temp directory)");
  cmd->add_option("--memory-dir", o.memory_dir, "the tier's parent directory (default: /dev/shm)");
  cmd->add_option("--storage-every", o.storage_every, "storage interval M that steps lost are stated for")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--memory-every", o.memory_every, "memory intervals K that steps lost are stated for")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_flag("--json", command->json, "print one JSON object");
  cmd->add_flag("--as-rank", command->as_rank)->group("");
  cmd->add_option("--memory-root", command->memory_root)->group("");
  cmd->add_option("--storage-root", command->storage_root)->group("");
  cmd->add_option("--result-file", command->result_file)->group("");
  cmd->callback([command] {
    if (command->as_rank) {
      const dist::ProcessGroup group = dist::init_process_group_from_env();
      const bench::MemoryTierBenchResult result =
          bench::run_memory_tier_rank(command->options, command->memory_root, command->storage_root, group);
      if (group.rank() == 0) std::ofstream(command->result_file) << bench::to_json(result).dump() << "\n";
      return;
    }
    if (command->nproc % command->nproc_per_node != 0 || command->nproc / command->nproc_per_node < 2) {
      throw InvalidArgument(
          fmt::format("bench memory-tier: --nproc {} over --nproc-per-node {} is not two nodes or more of equal size",
                      command->nproc, command->nproc_per_node));
    }
    const bench::MemoryTierBenchResult result = run_ranks(*command);
    bench::print_result(bench::to_json(result), bench::to_text(result), command->json);
  });
}

}  // namespace stowage::cli
