#include <stowage/dcp/memory_tier.h>

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dist/world.h>
#include <stowage/error.h>

#include "dcp/checkpoint_transfer.h"
#include "dcp/memory_tier_rep.h"
#include "util/exception_message.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <tuple>
#include <utility>

namespace stowage::dcp {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The lanes of a transfer: with two, a replication on this 2-core machine took 0.30-0.32 s
// for 256 MiB, with one 0.33-0.37 s (docs/benchmarks.md, issue 40).
constexpr int kTransferLanes = 2;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Retires all but the newest `keep` committed checkpoints of `directory`, and every
// uncommitted one (a save that died: none is in flight here).
void prune_directory(const std::string& directory, int64_t keep, PageRecycler& pages) {
  int64_t committed_seen = 0;
  const std::vector<ManagedCheckpoint> all = list_checkpoints(directory, pages);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->committed || ++committed_seen > keep) pages.retire(it->path);
  }
}

// Where a directory's PageRecycler keeps its spare files.
std::string spare_directory_of(const std::string& directory) {
  return (fs::path(directory) / "spare-pages").string();
}

// The bytes of the regular files under `path` (none if it is absent). A replication in
// flight may remove a file or directory while it counts: what is gone counts nothing.
int64_t tree_bytes(const std::string& path, Env& env) {
  try {
    const FileType type = env.file_type(path);
    if (type == FileType::kRegular) return env.open_for_reading(path)->size();
    if (type != FileType::kDirectory) return 0;
    int64_t bytes = 0;
    for (const std::string& name : env.list_directory(path)) bytes += tree_bytes((fs::path(path) / name).string(), env);
    return bytes;
  } catch (const NotFound&) {
    return 0;
  }
}

}  // namespace

NodeLayout node_layout_from_env(int64_t world_size) {
  NodeLayout layout;
  layout.node = dist::launcher_count("GROUP_RANK").value_or(0);
  layout.ranks_per_node = dist::launcher_count("LOCAL_WORLD_SIZE").value_or(world_size);
  if (layout.ranks_per_node == 0 || world_size % layout.ranks_per_node != 0) {
    throw InvalidArgument(
        fmt::format("LOCAL_WORLD_SIZE={} does not divide the job's {} ranks", layout.ranks_per_node, world_size));
  }
  return layout;
}

void check_memory_tier_options(const MemoryTierOptions& options) {
  if (options.save_every() < 0) {
    throw InvalidArgument(fmt::format("MemoryTierOptions: save_every must be >= 0, got {}", options.save_every()));
  }
  if (options.keep_last() != 1 && options.keep_last() != 2) {
    throw InvalidArgument(fmt::format("MemoryTierOptions: keep_last must be 1 or 2, got {}", options.keep_last()));
  }
  if (options.save_every() > 0 && options.directory().empty()) {
    throw InvalidArgument("MemoryTierOptions: the directory is empty");
  }
  if (options.env() == nullptr) throw InvalidArgument("MemoryTierOptions: the option env is null");
}

const char* restore_tier_name(RestoreTier tier) {
  switch (tier) {
    case RestoreTier::kNone:
      return "none";
    case RestoreTier::kMemory:
      return "memory";
    case RestoreTier::kPeerReplica:
      return "peer replica";
    case RestoreTier::kStorage:
      return "storage";
  }
  return "?";
}

std::vector<int64_t> committed_stowage_steps(const std::vector<ManagedCheckpoint>& checkpoints) {
  std::vector<int64_t> steps;
  for (const ManagedCheckpoint& checkpoint : checkpoints) {
    if (checkpoint.committed && checkpoint.format == CheckpointFormat::kStowage) steps.push_back(checkpoint.step);
  }
  return steps;
}

std::string MemoryTier::Rep::node_directory() const {
  return (fs::path(options.directory()) / fmt::format("node-{}", layout.node)).string();
}

std::string MemoryTier::Rep::own_directory() const {
  return (fs::path(node_directory()) / fmt::format("rank-{}-of-{}", rank, world_size)).string();
}

std::string MemoryTier::Rep::replica_directory(int64_t source) const {
  return (fs::path(node_directory()) / fmt::format("replica-of-rank-{}-of-{}", source, world_size)).string();
}

std::string MemoryTier::Rep::own_path(int64_t step) const {
  return (fs::path(own_directory()) / step_directory_name(step)).string();
}

std::string MemoryTier::Rep::replica_path(int64_t source, int64_t step) const {
  return (fs::path(replica_directory(source)) / step_directory_name(step)).string();
}

std::optional<int64_t> MemoryTier::Rep::peer_of(int64_t of) const {
  if (layout.ranks_per_node >= world_size) return std::nullopt;  // one node: no other to hold it
  return (of + layout.ranks_per_node) % world_size;
}

std::optional<int64_t> MemoryTier::Rep::source_of(int64_t of) const {
  if (layout.ranks_per_node >= world_size) return std::nullopt;
  return (of - layout.ranks_per_node + world_size) % world_size;
}

std::vector<std::string> MemoryTier::Rep::all_gather(const std::string& text) const {
  return group ? group->all_gather(text) : std::vector<std::string>{text};
}

std::string MemoryTier::Rep::agreed_error(const std::string& error) const {
  const std::vector<std::string> errors = all_gather(error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) return fmt::format("rank {}: {}", r, errors[r]);
  }
  return "";
}

MemoryTier::MemoryTier(MemoryTierOptions options, NodeLayout layout, std::optional<dist::ProcessGroup> group)
    : rep_(std::make_unique<Rep>()) {
  check_memory_tier_options(options);
  Rep& r = *rep_;
  r.options = std::move(options);
  r.layout = layout;
  r.group = std::move(group);
  r.rank = r.group ? r.group->rank() : 0;
  r.world_size = r.group ? r.group->size() : 1;
  if (layout.ranks_per_node < 1 || r.world_size % layout.ranks_per_node != 0 || layout.node < 0 ||
      layout.node >= r.world_size / layout.ranks_per_node) {
    throw InvalidArgument(fmt::format("MemoryTier: node {} with {} ranks per node does not fit a job of {} ranks",
                                      layout.node, layout.ranks_per_node, r.world_size));
  }
  r.env().create_directories(r.own_directory());
  r.own_pages = std::make_unique<PageRecycler>(r.options.env(), spare_directory_of(r.own_directory()));
  if (r.source_of(r.rank)) {
    r.env().create_directories(r.replica_directory(*r.source_of(r.rank)));
    r.replica_pages =
        std::make_unique<PageRecycler>(r.options.env(), spare_directory_of(r.replica_directory(*r.source_of(r.rank))));
    // One set per job's group, kept with it: a later tier on the same group uses it again.
    r.transfer_lanes = *std::static_pointer_cast<std::vector<dist::ProcessGroup>>(
        r.group->attachment("dcp.memory_tier.transfer_lanes", [&] {
          auto lanes = std::make_shared<std::vector<dist::ProcessGroup>>();
          for (int lane = 0; lane < kTransferLanes; ++lane) {
            lanes->push_back(r.group->new_group(fmt::format("memory-tier-lane-{}", lane)));
          }
          return lanes;
        }));
  }
}

MemoryTier::~MemoryTier() {
  // A replication in flight uses the Rep: it ends first. Its report has no one to go to.
  rep_->wait_for_replication();
}

std::string MemoryTier::node_directory() const {
  return rep_->node_directory();
}

std::string MemoryTier::own_path(int64_t step) const {
  return rep_->own_path(step);
}

std::string MemoryTier::replica_path(int64_t step) const {
  TORCH_CHECK(source(), "MemoryTier::replica_path: one node holds no replicas");
  return rep_->replica_path(*source(), step);
}

std::optional<int64_t> MemoryTier::peer() const {
  return rep_->peer_of(rep_->rank);
}

std::optional<int64_t> MemoryTier::source() const {
  return rep_->source_of(rep_->rank);
}

bool MemoryTier::should_save(int64_t step) const {
  return rep_->options.save_every() > 0 && step % rep_->options.save_every() == 0;
}

MemorySaveReport MemoryTier::save(int64_t step, const StateDict& state) {
  Rep& r = *rep_;
  MemorySaveReport report;
  report.step = step;
  report.previous_replication = r.finish_replication();
  std::string error;
  const auto start = Clock::now();
  try {
    const std::string path = own_path(step);
    r.own_pages->retire(path);
    // Memory is not a disk: no fsync. The commit rule (metadata last) still holds.
    FileSystemWriter writer(path, FileSystemWriterOptions().env(r.own_pages.get()).sync_files(false));
    dcp::save(state, writer);  // this rank's state alone, without the group
    report.bytes = tree_bytes(path, r.env());
    // Until its replication ends, the one before it stays: the newest step a lost node's
    // ranks can fetch from their peers (finish_replication prunes it).
    prune_directory(r.own_directory(), r.options.keep_last() + (peer() ? 1 : 0), *r.own_pages);
  } catch (const std::exception& failure) {
    error = exception_message(failure);
  }
  report.save_s = seconds_since(start);
  report.error = r.agreed_error(error);
  if (peer() && report.error.empty()) {
    r.replicating = ReplicationInFlight{step, std::async(std::launch::async, [&r, step] { return r.replicate(step); })};
  }
  return report;
}

std::pair<double, std::string> MemoryTier::Rep::replicate(int64_t step) const {
  const auto start = Clock::now();
  const int64_t source = *source_of(rank);
  std::string error;
  try {
    // One transfer around the ring: each rank's checkpoint crosses the network once. A
    // peer that gets nothing, or nothing whole, keeps the replicas it has.
    const TransferOutcome outcome = transfer_checkpoint(CheckpointTransfer()
                                                            .send_path(own_path(step))
                                                            .to(*peer_of(rank))
                                                            .receive_path(replica_path(source, step))
                                                            .from(source),
                                                        transfer_lanes, *replica_pages);
    error = outcome.send_error;
    if (error.empty() && !outcome.receive_error.empty()) {
      error = fmt::format("the replica of rank {}: {}", source, outcome.receive_error);
    }
    if (outcome.committed) prune_directory(replica_directory(source), options.keep_last(), *replica_pages);
  } catch (const std::exception& failure) {
    if (error.empty()) error = fmt::format("the replica of rank {}: {}", source, exception_message(failure));
  }
  return {seconds_since(start), error};
}

std::optional<ReplicationReport> MemoryTier::Rep::wait_for_replication() {
  if (!replicating) return std::nullopt;
  ReplicationReport report;
  report.step = replicating->step;
  std::tie(report.replicate_s, report.error) = replicating->outcome.get();
  replicating.reset();
  try {
    prune_directory(own_directory(), options.keep_last(), *own_pages);
  } catch (const std::exception& failure) {
    if (report.error.empty()) report.error = exception_message(failure);
  }
  return report;
}

std::optional<ReplicationReport> MemoryTier::Rep::finish_replication() {
  std::optional<ReplicationReport> report = wait_for_replication();
  if (report) report->error = agreed_error(report->error);
  return report;
}

std::optional<ReplicationReport> MemoryTier::finish_replication() {
  return rep_->finish_replication();
}

void MemoryTier::clear() {
  Rep& r = *rep_;
  r.wait_for_replication();
  prune_directory(r.own_directory(), 0, *r.own_pages);
  r.env().remove_tree(r.own_directory());
  if (source()) {
    prune_directory(r.replica_directory(*source()), 0, *r.replica_pages);
    r.env().remove_tree(r.replica_directory(*source()));
  }
}

int64_t MemoryTier::replication_buffer_bytes(int64_t own_bytes, int64_t replica_bytes) {
  return transfer_buffer_bytes(kTransferLanes, CheckpointTransfer().piece_bytes(), own_bytes, replica_bytes);
}

int64_t MemoryTier::held_bytes() const {
  const Rep& r = *rep_;
  int64_t bytes = tree_bytes(r.own_directory(), r.env());
  if (source()) bytes += tree_bytes(r.replica_directory(*source()), r.env());
  return bytes;
}

}  // namespace stowage::dcp
