#include "memory_tier_bench.h"

#include "bench_util.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/memory_tier.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace stowage::bench {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The slowest rank's `seconds`, on every rank.
double slowest_rank(const dist::ProcessGroup& group, double seconds) {
  double slowest = 0;
  for (const std::string& each : group.all_gather(fmt::format("{}", seconds))) {
    slowest = std::max(slowest, std::stod(each));
  }
  return slowest;
}

// Each rank's own tensors, under keys of its own ("rank-1.layers.3"), so that a save to
// storage with the group writes every rank's bytes, as the memory tier does.
struct TierBenchState {
  StateDict state;
  std::vector<at::Tensor> tensors;
  std::vector<at::Tensor> expected;  // the first and last tensors' values, to check a restore
  int64_t bytes = 0;
};

TierBenchState make_tier_bench_state(const MemoryTierBenchOptions& options, int64_t rank) {
  if (options.size_mib < 1 || options.tensors < 1 || options.rounds < 1) {
    throw InvalidArgument("bench memory-tier: the size, the tensor count and the rounds must be positive");
  }
  const int64_t numel = options.size_mib * (int64_t(1) << 20) / 4 / options.tensors;
  TierBenchState s;
  for (int64_t i = 0; i < options.tensors; ++i) {
    s.tensors.push_back(torch::empty({numel}).uniform_());
    s.state.insert(fmt::format("rank-{}.layers.{}", rank, i), s.tensors.back());
    s.bytes += s.tensors.back().nbytes();
  }
  s.expected = {s.tensors.front().clone(), s.tensors.back().clone()};
  return s;
}

// Zeroes the state, so that a restore that loaded nothing is seen by check_restored.
void zero_state(TierBenchState& s) {
  for (at::Tensor& t : s.tensors) t.zero_();
}

void check_restored(const TierBenchState& s, const dcp::TierRestore& restored, dcp::RestoreTier tier, int64_t step) {
  if (restored.tier != tier || restored.step != step) {
    throw Error(fmt::format("bench memory-tier: expected step {} from {}, got step {} from {}{}", step,
                            dcp::restore_tier_name(tier), restored.step ? std::to_string(*restored.step) : "none",
                            dcp::restore_tier_name(restored.tier),
                            restored.skipped.empty() ? "" : " (" + restored.skipped.front() + ")"));
  }
  if (!torch::equal(s.tensors.front(), s.expected[0]) || !torch::equal(s.tensors.back(), s.expected[1])) {
    throw Error(
        fmt::format("bench memory-tier: the restore from {} returned other values", dcp::restore_tier_name(tier)));
  }
}

std::vector<std::string> regular_files(const std::string& directory) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  return files;
}

// Out of the page cache, as after a node's restart: each file fsync'd (dirty pages are
// not dropped), then posix_fadvise(POSIX_FADV_DONTNEED).
void drop_from_page_cache(const std::string& directory) {
  for (const std::string& path : regular_files(directory)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0 || ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
      const int error = errno;
      if (fd >= 0) ::close(fd);
      throw Error(
          fmt::format("bench memory-tier: cannot drop '{}' from the page cache: {}", path, std::strerror(error)));
    }
    ::close(fd);
  }
}

// The fraction of the files' pages in the page cache (mincore over a mapping of each).
double resident_fraction(const std::string& directory) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t pages = 0;
  int64_t resident = 0;
  for (const std::string& path : regular_files(directory)) {
    const auto size = static_cast<int64_t>(fs::file_size(path));
    if (size == 0) continue;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    void* map = fd < 0 ? MAP_FAILED : ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) ::close(fd);
    if (map == MAP_FAILED) throw Error(fmt::format("bench memory-tier: cannot map '{}'", path));
    std::vector<unsigned char> in_core(static_cast<size_t>((size + page - 1) / page));
    const int status = ::mincore(map, static_cast<size_t>(size), in_core.data());
    ::munmap(map, static_cast<size_t>(size));
    if (status != 0) throw Error(fmt::format("bench memory-tier: mincore failed on '{}'", path));
    pages += static_cast<int64_t>(in_core.size());
    for (const unsigned char c : in_core) resident += c & 1;
  }
  return pages == 0 ? 0 : static_cast<double>(resident) / static_cast<double>(pages);
}

int64_t directory_bytes(const std::string& directory) {
  int64_t bytes = 0;
  for (const std::string& path : regular_files(directory)) bytes += static_cast<int64_t>(fs::file_size(path));
  return bytes;
}

// What one rank measures; run_memory_tier_rank keeps the medians of the rounds.
struct TierRound {
  std::vector<double> memory_save_s, memory_replicate_s, memory_replicated_s, storage_block_s, storage_commit_s,
      restore_memory_s, restore_replica_s, restore_storage_s;
  double resident = 0;
};

// A save of `step` to each tier, timed.
void time_saves(TierBenchState& s, int64_t step, dcp::MemoryTier& tier, dcp::CheckpointManager& storage,
                const dist::ProcessGroup& group, TierRound& round) {
  group.barrier();
  const auto start = std::chrono::steady_clock::now();
  const dcp::MemorySaveReport memory = tier.save(step, s.state);
  const double blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::optional<dcp::ReplicationReport> replication = tier.finish_replication();
  const double replicated = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!memory.error.empty()) throw Error("bench memory-tier: the memory save failed: " + memory.error);
  if (!replication || !replication->error.empty()) {
    throw Error("bench memory-tier: the replication failed: " + (replication ? replication->error : "none ran"));
  }
  round.memory_save_s.push_back(slowest_rank(group, blocked));
  round.memory_replicate_s.push_back(slowest_rank(group, replication->replicate_s));
  round.memory_replicated_s.push_back(slowest_rank(group, replicated));
  group.barrier();
  storage.save(step, s.state, /*force=*/true);
  storage.wait_for_staging();
  const std::vector<dcp::SaveReport> reports = storage.wait();
  if (reports.empty() || !reports.back().committed || reports.back().step != step) {
    throw Error(fmt::format("bench memory-tier: the storage save of step {} did not commit{}", step,
                            reports.empty() ? "" : ": " + reports.back().error));
  }
  round.storage_block_s.push_back(slowest_rank(group, reports.back().blocked_s));
  round.storage_commit_s.push_back(slowest_rank(group, reports.back().commit_s));
}

// A restore of `step` from `tier`, timed from a barrier to the slowest rank's end.
double time_restore(TierBenchState& s, int64_t step, dcp::MemoryTier& memory, dcp::CheckpointManager& storage,
                    const dist::ProcessGroup& group, dcp::RestoreTier tier) {
  zero_state(s);
  group.barrier();
  const auto start = std::chrono::steady_clock::now();
  const dcp::TierRestore restored = memory.restore(s.state, storage);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_restored(s, restored, tier, step);
  return slowest_rank(group, seconds);
}

// The three recoveries of `step`: all memory there; node 1 lost (its ranks' own copies
// and the replicas it held); every memory copy lost and storage cold.
void time_restores(TierBenchState& s, int64_t step, dcp::MemoryTier& memory, dcp::CheckpointManager& storage,
                   const dist::ProcessGroup& group, int64_t node, TierRound& round) {
  round.restore_memory_s.push_back(time_restore(s, step, memory, storage, group, dcp::RestoreTier::kMemory));
  group.barrier();
  if (node == 1) {
    fs::remove_all(fs::path(memory.own_path(step)).parent_path());
    fs::remove_all(fs::path(memory.replica_path(step)).parent_path());
  }
  round.restore_replica_s.push_back(time_restore(s, step, memory, storage, group, dcp::RestoreTier::kPeerReplica));
  memory.clear();
  drop_from_page_cache(storage.checkpoint_path(step));
  group.barrier();
  round.resident = std::max(round.resident, resident_fraction(storage.checkpoint_path(step)));
  round.restore_storage_s.push_back(time_restore(s, step, memory, storage, group, dcp::RestoreTier::kStorage));
}

// a / b, 0 when b is.
double ratio_of(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

}  // namespace

double mean_steps_lost(int64_t every) {
  return every < 1 ? 0 : static_cast<double>(every - 1) / 2;
}

double MemoryTierBenchResult::memory_save_gbps() const {
  return memory_save_s > 0 ? gbps(bytes_per_rank * ranks, memory_save_s) : 0;
}

double MemoryTierBenchResult::memory_replicated_gbps() const {
  return memory_replicated_s > 0 ? gbps(bytes_per_rank * ranks, memory_replicated_s) : 0;
}

double MemoryTierBenchResult::storage_save_gbps() const {
  return storage_commit_s > 0 ? gbps(bytes_per_rank * ranks, storage_commit_s) : 0;
}

double MemoryTierBenchResult::save_ratio() const {
  return ratio_of(memory_save_gbps(), storage_save_gbps());
}

double MemoryTierBenchResult::replicated_save_ratio() const {
  return ratio_of(memory_replicated_gbps(), storage_save_gbps());
}

double MemoryTierBenchResult::memory_restore_ratio() const {
  return ratio_of(restore_storage_s, restore_memory_s);
}

double MemoryTierBenchResult::replica_restore_ratio() const {
  return ratio_of(restore_storage_s, restore_replica_s);
}

MemoryTierBenchResult run_memory_tier_rank(const MemoryTierBenchOptions& options, const std::string& memory_dir,
                                           const std::string& storage_dir, const dist::ProcessGroup& group) {
  TierBenchState s = make_tier_bench_state(options, group.rank());
  const dcp::NodeLayout layout = dcp::node_layout_from_env(group.size());
  if (layout.ranks_per_node >= group.size()) {
    throw InvalidArgument("bench memory-tier: replicas need two nodes at least (LOCAL_WORLD_SIZE < WORLD_SIZE)");
  }
  dcp::MemoryTier memory(dcp::MemoryTierOptions(memory_dir).save_every(1), layout, group);
  dcp::CheckpointManager storage(storage_dir, dcp::CheckpointManagerOptions().keep_last(1), group);
  MemoryTierBenchResult r;
  r.ranks = group.size();
  r.ranks_per_node = layout.ranks_per_node;
  r.bytes_per_rank = s.bytes;
  r.storage_every = options.storage_every;
  r.memory_every = options.memory_every;
  // Warm-up (the stager's buffers, the tier's directories), and the tier holding
  // keep_last steps, as in a run: its host bytes.
  TierRound warm_up;
  time_saves(s, 1, memory, storage, group, warm_up);
  time_saves(s, 2, memory, storage, group, warm_up);
  group.barrier();
  r.memory_host_bytes = directory_bytes(memory_dir);
  TierRound round;
  for (int i = 0; i < options.rounds; ++i) {
    // The tier as in a run (keep_last steps and the pages of a dropped one to write
    // over), which the last round's restores cleared.
    const int64_t step = 10 * (i + 1);
    for (int64_t k = step - 3; k < step; ++k) {
      if (!memory.save(k, s.state).error.empty() || !memory.finish_replication()->error.empty()) {
        throw Error(fmt::format("bench memory-tier: the warm-up save of step {} failed", k));
      }
    }
    time_saves(s, step, memory, storage, group, round);
    time_restores(s, step, memory, storage, group, layout.node, round);
  }
  memory.clear();
  r.memory_save_s = median(round.memory_save_s);
  r.memory_replicate_s = median(round.memory_replicate_s);
  r.memory_replicated_s = median(round.memory_replicated_s);
  r.storage_block_s = median(round.storage_block_s);
  r.storage_commit_s = median(round.storage_commit_s);
  r.restore_memory_s = median(round.restore_memory_s);
  r.restore_replica_s = median(round.restore_replica_s);
  r.restore_storage_s = median(round.restore_storage_s);
  r.storage_resident_fraction = slowest_rank(group, round.resident);
  return r;
}

json to_json(const MemoryTierBenchResult& r) {
  json steps_lost = json::array();
  for (const int64_t every : r.memory_every) {
    steps_lost.push_back({{"memory_every", every},
                          {"mean_steps_lost", mean_steps_lost(every)},
                          {"memory_save_s_per_step", r.memory_save_s / static_cast<double>(every)}});
  }
  return {{"ranks", r.ranks},
          {"ranks_per_node", r.ranks_per_node},
          {"bytes_per_rank", r.bytes_per_rank},
          {"memory_save_s", r.memory_save_s},
          {"memory_replicate_s", r.memory_replicate_s},
          {"memory_replicated_s", r.memory_replicated_s},
          {"memory_save_gbps", r.memory_save_gbps()},
          {"memory_replicated_gbps", r.memory_replicated_gbps()},
          {"storage_block_s", r.storage_block_s},
          {"storage_commit_s", r.storage_commit_s},
          {"storage_save_gbps", r.storage_save_gbps()},
          {"memory_over_storage_save", r.save_ratio()},
          {"replicated_over_storage_save", r.replicated_save_ratio()},
          {"restore_memory_s", r.restore_memory_s},
          {"restore_replica_s", r.restore_replica_s},
          {"restore_storage_cold_s", r.restore_storage_s},
          {"storage_over_memory_restore", r.memory_restore_ratio()},
          {"storage_over_replica_restore", r.replica_restore_ratio()},
          {"storage_resident_fraction", r.storage_resident_fraction},
          {"memory_host_bytes", r.memory_host_bytes},
          {"storage_every", r.storage_every},
          {"storage_mean_steps_lost", mean_steps_lost(r.storage_every)},
          {"steps_lost", steps_lost}};
}

MemoryTierBenchResult memory_tier_result_from_json(const json& j) {
  MemoryTierBenchResult r;
  r.ranks = j.at("ranks").get<int64_t>();
  r.ranks_per_node = j.at("ranks_per_node").get<int64_t>();
  r.bytes_per_rank = j.at("bytes_per_rank").get<int64_t>();
  r.memory_save_s = j.at("memory_save_s").get<double>();
  r.memory_replicate_s = j.at("memory_replicate_s").get<double>();
  r.memory_replicated_s = j.at("memory_replicated_s").get<double>();
  r.storage_block_s = j.at("storage_block_s").get<double>();
  r.storage_commit_s = j.at("storage_commit_s").get<double>();
  r.restore_memory_s = j.at("restore_memory_s").get<double>();
  r.restore_replica_s = j.at("restore_replica_s").get<double>();
  r.restore_storage_s = j.at("restore_storage_cold_s").get<double>();
  r.storage_resident_fraction = j.at("storage_resident_fraction").get<double>();
  r.memory_host_bytes = j.at("memory_host_bytes").get<int64_t>();
  r.storage_every = j.at("storage_every").get<int64_t>();
  for (const json& row : j.at("steps_lost")) r.memory_every.push_back(row.at("memory_every").get<int64_t>());
  return r;
}

std::string to_text(const MemoryTierBenchResult& r) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const auto verdict = [](double ratio) { return ratio >= 5 ? "met" : "NOT met"; };
  std::string text = fmt::format(
      "memory tier: {} ranks, {} per node, {:.0f} MiB each\n"
      "  save, memory tier: {:.3f} s blocked, own copy committed, {:.2f} GB/s; replicas committed "
      "{:.3f} s later in the background ({:.3f} s from the save, {:.2f} GB/s)\n"
      "  save, storage:     {:.3f} s blocked, {:.3f} s to commit (fsync'd), {:.2f} GB/s\n"
      "  memory / storage save throughput to commit: {:.1f}x (target >= 5x: {}); with the replicas: {:.1f}x\n"
      "  restore: own memory {:.3f} s, peer replica {:.3f} s, storage cold {:.3f} s (resident before: {:.1f}%)\n"
      "  restore, storage / own memory: {:.1f}x (target >= 5x: {}); storage / peer replica: {:.1f}x (target >= 5x: "
      "{})\n"
      "  host bytes held by the tier (all nodes, own + replicas): {:.0f} MiB\n"
      "  steps lost per failure (mean, uniformly random step): storage every {}: {:.1f}",
      r.ranks, r.ranks_per_node, static_cast<double>(r.bytes_per_rank) / kMiB, r.memory_save_s, r.memory_save_gbps(),
      r.memory_replicate_s, r.memory_replicated_s, r.memory_replicated_gbps(), r.storage_block_s, r.storage_commit_s,
      r.storage_save_gbps(), r.save_ratio(), verdict(r.save_ratio()), r.replicated_save_ratio(), r.restore_memory_s,
      r.restore_replica_s, r.restore_storage_s, 100 * r.storage_resident_fraction, r.memory_restore_ratio(),
      verdict(r.memory_restore_ratio()), r.replica_restore_ratio(), verdict(r.replica_restore_ratio()),
      static_cast<double>(r.memory_host_bytes) / kMiB, r.storage_every, mean_steps_lost(r.storage_every));
  for (const int64_t every : r.memory_every) {
    text += fmt::format("; memory every {}: {:.1f} ({:.1f} ms of save a step)", every, mean_steps_lost(every),
                        1e3 * r.memory_save_s / static_cast<double>(every));
  }
  return text + "\n";
}

}  // namespace stowage::bench
