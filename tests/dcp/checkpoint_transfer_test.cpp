// A committed checkpoint sent to another rank over several lanes (issue 40: the memory
// tier's replicas and their way back): it arrives whole and committed, in pieces that
// cross file boundaries; a send or a write that fails part way commits nothing, and
// nothing hangs. Ranks run as threads, around a ring of three.

#include "dcp/checkpoint_transfer.h"
#include "dcp/fault_injection_env.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/memory/host_buffer.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace stowage::dcp::testing {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kRanks = 3;

// A state of odd sizes, whose values only `rank` has.
StateDict transfer_state(int64_t rank) {
  return state_of({{"a", at::arange(10007, at::kFloat).add_(static_cast<double>(rank * 100000))},
                   {"b", at::arange(333, at::kDouble).mul_(static_cast<double>(rank + 1))}});
}

std::string sent_path(const ScratchDir& dir, int64_t rank) {
  return dir.sub(fmt::format("sent-{}", rank));
}

std::string received_path(const ScratchDir& dir, int64_t rank) {
  return dir.sub(fmt::format("received-{}", rank));
}

// Each rank's checkpoint, saved in two data files (two writer threads).
void save_sent_checkpoints(const ScratchDir& dir) {
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    FileSystemWriter writer(sent_path(dir, rank), FileSystemWriterOptions().thread_count(2).sync_files(false));
    save(transfer_state(rank), writer);
  }
}

// Every rank sends its checkpoint to the next one round the ring, in pieces of
// `piece_bytes` over two lanes, reading and writing through env_of(rank).
std::vector<TransferOutcome> transfer_around_the_ring(const ScratchDir& dir, int64_t piece_bytes,
                                                      const std::function<Env&(int64_t)>& env_of) {
  std::vector<TransferOutcome> outcomes(kRanks);
  stowage::testing::run_ranks(kRanks, [&](const dist::ProcessGroup& group) {
    const int64_t rank = group.rank();
    const std::vector<dist::ProcessGroup> lanes{group.new_group("lane-0"), group.new_group("lane-1")};
    const CheckpointTransfer transfer = CheckpointTransfer()
                                            .send_path(sent_path(dir, rank))
                                            .to((rank + 1) % kRanks)
                                            .receive_path(received_path(dir, rank))
                                            .from((rank + kRanks - 1) % kRanks)
                                            .piece_bytes(piece_bytes);
    outcomes[static_cast<size_t>(rank)] = transfer_checkpoint(transfer, lanes, env_of(rank));
  });
  return outcomes;
}

Env& posix(int64_t /*rank*/) {
  return *Env::posix();
}

TEST(CheckpointTransfer, ACheckpointCutIntoPiecesArrivesWholeAndCommitted) {
  const ScratchDir dir;
  save_sent_checkpoints(dir);
  ASSERT_EQ(data_files(sent_path(dir, 0)).size(), 2u);
  // 1000-byte pieces: dozens of them, alternating lanes, several across file boundaries.
  const std::vector<TransferOutcome> outcomes = transfer_around_the_ring(dir, 1000, posix);
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    const TransferOutcome& outcome = outcomes[static_cast<size_t>(rank)];
    EXPECT_EQ(outcome.send_error, "");
    EXPECT_EQ(outcome.receive_error, "");
    EXPECT_TRUE(outcome.came && outcome.committed);
    const int64_t from = (rank + kRanks - 1) % kRanks;
    const std::string sent = sent_path(dir, from);
    const std::string received = received_path(dir, rank);
    EXPECT_EQ(list_files(received), list_files(sent));
    for (const std::string& name : list_files(sent)) {
      EXPECT_EQ(read_file(received + "/" + name), read_file(sent + "/" + name)) << name;
    }
    StateDict loaded = state_of({{"a", at::zeros({10007}, at::kFloat)}, {"b", at::zeros({333}, at::kDouble)}});
    FileSystemReader reader(received);
    load(loaded, reader);
    EXPECT_TRUE(loaded.at("a").toTensor().equal(transfer_state(from).at("a").toTensor())) << "rank " << rank;
    EXPECT_TRUE(loaded.at("b").toTensor().equal(transfer_state(from).at("b").toTensor())) << "rank " << rank;
  }
}

// Rank 0's third read fails: rank 1 receives the rest of the pieces and commits nothing
// (a previous checkpoint at its path is replaced by an uncommitted one, as a torn write
// leaves it); the other ranks' transfers are untouched.
TEST(CheckpointTransfer, ASendThatFailsPartWayCommitsNothing) {
  const ScratchDir dir;
  save_sent_checkpoints(dir);
  FaultInjectionEnv failing;
  failing.fail(Call::kRead, 3);
  const std::vector<TransferOutcome> outcomes =
      transfer_around_the_ring(dir, 1000, [&](int64_t rank) -> Env& { return rank == 0 ? failing : *Env::posix(); });
  EXPECT_NE(outcomes[0].send_error.find(sent_path(dir, 0)), std::string::npos) << outcomes[0].send_error;
  EXPECT_TRUE(outcomes[1].came);
  EXPECT_FALSE(outcomes[1].committed);
  EXPECT_NE(outcomes[1].receive_error.find("rank 0 could not read it"), std::string::npos) << outcomes[1].receive_error;
  EXPECT_FALSE(fs::exists(metadata_path(received_path(dir, 1))));
  EXPECT_TRUE(outcomes[2].committed);
  EXPECT_TRUE(outcomes[0].committed);  // rank 0 received through the failing Env: only reads fail
}

// Rank 2's second write fails: it commits nothing, and rank 1, which sent it, is told
// nothing of it (its send went well).
TEST(CheckpointTransfer, AWriteThatFailsPartWayCommitsNothing) {
  const ScratchDir dir;
  save_sent_checkpoints(dir);
  FaultInjectionEnv failing;
  failing.fail(Call::kWrite, 2, ENOSPC);
  const std::vector<TransferOutcome> outcomes =
      transfer_around_the_ring(dir, 1000, [&](int64_t rank) -> Env& { return rank == 2 ? failing : *Env::posix(); });
  EXPECT_FALSE(outcomes[2].committed);
  EXPECT_NE(outcomes[2].receive_error.find(received_path(dir, 2)), std::string::npos) << outcomes[2].receive_error;
  EXPECT_FALSE(fs::exists(metadata_path(received_path(dir, 2))));
  EXPECT_EQ(outcomes[1].send_error, "");
  EXPECT_TRUE(outcomes[0].committed && outcomes[1].committed);
}

// The budget of train::TrainerOptions reserves transfer_buffer_bytes for a replication:
// a lane's buffers are counted as checkpoint memory, and they are all a transfer holds.
// One rank sends to itself over one lane, so that nothing else's buffers are counted
// with them and both are live at once (several lanes' may not be: a lane can end before
// another begins, and the reserve is their most).
TEST(CheckpointTransfer, ItsBuffersAreCountedAsCheckpointMemoryAndAreNeverAWholeCheckpoint) {
  const ScratchDir dir;
  save_sent_checkpoints(dir);
  int64_t checkpoint_bytes = 0;
  for (const std::string& name : list_files(sent_path(dir, 0))) {
    checkpoint_bytes += static_cast<int64_t>(fs::file_size(sent_path(dir, 0) + "/" + name));
  }
  int64_t peak = 0;
  stowage::testing::run_ranks(1, [&](const dist::ProcessGroup& group) {
    memory::reset_peak_host_buffer_stats();
    const int64_t before = memory::host_buffer_stats().checkpoint_bytes;
    const CheckpointTransfer to_itself =
        CheckpointTransfer().send_path(sent_path(dir, 0)).receive_path(received_path(dir, 0)).piece_bytes(1000);
    EXPECT_TRUE(transfer_checkpoint(to_itself, {group}, *Env::posix()).committed);
    peak = memory::host_buffer_stats().checkpoint_peak_bytes - before;
  });
  EXPECT_EQ(peak, transfer_buffer_bytes(1, 1000, checkpoint_bytes, checkpoint_bytes));
  EXPECT_EQ(peak, 2 * memory::host_allocation_bytes(1000));  // a page for each of its 2 buffers
  EXPECT_LT(peak, checkpoint_bytes);
}

// An uncommitted checkpoint is not sent: its receiver hears of none, and keeps what it had.
TEST(CheckpointTransfer, AnUncommittedCheckpointIsNotSent) {
  const ScratchDir dir;
  save_sent_checkpoints(dir);
  fs::remove(metadata_path(sent_path(dir, 1)));
  fs::create_directories(received_path(dir, 2));
  write_file(received_path(dir, 2) + "/kept", "what rank 2 had");
  const std::vector<TransferOutcome> outcomes = transfer_around_the_ring(dir, 1 << 20, posix);
  EXPECT_NE(outcomes[1].send_error.find("is not a committed checkpoint"), std::string::npos) << outcomes[1].send_error;
  EXPECT_FALSE(outcomes[2].came);
  EXPECT_EQ(read_file(received_path(dir, 2) + "/kept"), "what rank 2 had");
  EXPECT_TRUE(outcomes[0].committed && outcomes[1].committed);
}

}  // namespace
}  // namespace stowage::dcp::testing
