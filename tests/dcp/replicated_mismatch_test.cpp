// A tensor several ranks hold (replicated, or a shard held twice) is saved once; the save
// checks that every rank's copy is the same bytes, and fails on every rank, naming the
// entry, when they are not, rather than keep one rank's silently. BatchNorm's running
// statistics under a GradientReducer are the case that drifts (issue: rank 0 resumed with
// rank 1's statistics).
#include "dcp/test_util.h"
#include "process_groups.h"

#include <stowage/dcp/dcp.h>
#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

namespace stowage::dcp {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

// Every rank's message of a save that must fail on every rank.
template <typename Save>
std::vector<std::string> failures_of_save(int64_t ranks, Save save) {
  std::vector<std::string> messages(static_cast<size_t>(ranks));
  stowage::testing::run_ranks(ranks, [&](const dist::ProcessGroup& group) {
    try {
      save(group);
      ADD_FAILURE() << "rank " << group.rank() << " saved";
    } catch (const DistributedCheckpointError& e) {
      messages[static_cast<size_t>(group.rank())] = e.what();
    }
  });
  return messages;
}

// Rank `rank`'s state: a weight every rank holds the same, and a running mean that is the
// rank's own unless `agree`.
StateDict model_state(int64_t rank, bool agree) {
  StateDict state;
  state.insert("weight", torch::arange(64, torch::kFloat));
  state.insert("norm.running_mean", torch::full({16}, agree ? 0.5 : 0.5 + static_cast<double>(rank)));
  state.insert("step", c10::IValue(int64_t{7}));
  return state;
}

// The global plan lists, by rank, the boxes it holds that another rank holds too, written
// by one of them or not; a box one rank holds alone is no replica.
TEST(DcpReplicatedMismatch, TheGlobalPlanListsEachRanksCopiesOfReplicatedBoxes) {
  std::vector<SavePlan> plans;
  for (int64_t rank = 0; rank < 3; ++rank) {
    StateDict state;
    if (rank < 2) state.insert("shared", torch::ones({4}));
    state.insert("own" + std::to_string(rank), torch::ones({2}));
    plans.push_back(create_local_save_plan(SaveableState(state), rank));
  }
  const GlobalSavePlan global = create_global_save_plan(plans);
  ASSERT_EQ(global.replicas.size(), 3u);
  for (size_t rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(global.replicas[rank].size(), 1u) << "rank " << rank;
    EXPECT_EQ(global.replicas[rank][0].fqn, "shared");
  }
  EXPECT_TRUE(global.replicas[2].empty());
}

TEST(DcpReplicatedMismatch, AReplicatedEntryWhoseRanksDifferFailsTheSaveNamingItOnEveryRank) {
  const ScratchDir dir;
  const std::string checkpoint = dir.sub("ckpt");
  const std::vector<std::string> messages = failures_of_save(
      2, [&](const dist::ProcessGroup& group) { save(model_state(group.rank(), false), checkpoint, group); });
  for (size_t rank = 0; rank < messages.size(); ++rank) {
    EXPECT_THAT(messages[rank],
                HasSubstr("checkpoint entry 'norm.running_mean' is replicated (ranks 0 and 1 both "
                          "hold it, and only one copy is saved) but rank 1's bytes differ from rank 0's"))
        << "rank " << rank;
    EXPECT_THAT(messages[rank], ::testing::Not(HasSubstr("'weight'"))) << "rank " << rank;
  }
  EXPECT_FALSE(std::filesystem::exists(testing::metadata_path(checkpoint))) << "a checkpoint was committed";
  EXPECT_TRUE(!std::filesystem::exists(checkpoint) || testing::data_files(checkpoint).empty())
      << "the failed save's data files stayed";
}

TEST(DcpReplicatedMismatch, ReplicatedEntriesThatAgreeAreSavedOnceAndLoad) {
  const ScratchDir dir;
  const std::string checkpoint = dir.sub("ckpt");
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    const Metadata metadata = save(model_state(group.rank(), true), checkpoint, group);
    const EntryMetadata* mean = metadata.find("norm.running_mean");
    ASSERT_NE(mean, nullptr);
    EXPECT_EQ(mean->chunks.size(), 1u) << "written more than once";
    StateDict loaded = model_state(group.rank(), false);
    load(loaded, checkpoint, {}, group);
    EXPECT_TRUE(loaded.at("norm.running_mean").toTensor().equal(torch::full({16}, 0.5)));
  });
}

// A shard that two ranks hold (a replica group of a sharded model): ranks 0 and 1 hold
// the first half, 2 and 3 the second; rank 3's copy differs.
TEST(DcpReplicatedMismatch, AShardTwoRanksHoldWithDifferentBytesFailsTheSaveNamingItsBox) {
  const ScratchDir dir;
  const std::string checkpoint = dir.sub("ckpt");
  const auto shard_state = [](int64_t rank, bool agree) {
    const int64_t half = rank / 2;
    StateDict state;
    const double value = static_cast<double>(half) + (!agree && rank == 3 ? 0.25 : 0.0);
    state.insert("w", sharded_tensor(torch::full({4, 3}, value), {8, 3}, {4 * half, 0}));
    return state;
  };
  const std::vector<std::string> messages = failures_of_save(
      4, [&](const dist::ProcessGroup& group) { save(shard_state(group.rank(), false), checkpoint, group); });
  for (size_t rank = 0; rank < messages.size(); ++rank) {
    EXPECT_THAT(messages[rank], HasSubstr("checkpoint entry 'w' (its box at offsets [4, 0]) is replicated (ranks 2 "
                                          "and 3 both hold it"))
        << "rank " << rank;
  }
  stowage::testing::run_ranks(
      4, [&](const dist::ProcessGroup& group) { save(shard_state(group.rank(), true), checkpoint, group); });
  EXPECT_TRUE(std::filesystem::exists(testing::metadata_path(checkpoint)));
}

// async_save hashes the staged copy on its background thread, and fails the upload.
TEST(DcpReplicatedMismatch, AnAsyncSaveOfDifferingCopiesFailsItsUploadOnEveryRank) {
  const ScratchDir dir;
  const std::string checkpoint = dir.sub("ckpt");
  const std::vector<std::string> messages = failures_of_save(2, [&](const dist::ProcessGroup& group) {
    AsyncSaveResponse response = async_save(model_state(group.rank(), false), checkpoint, nullptr, {}, group);
    response.upload_completion.get();
  });
  for (size_t rank = 0; rank < messages.size(); ++rank) {
    EXPECT_THAT(messages[rank], HasSubstr("checkpoint entry 'norm.running_mean' is replicated")) << "rank " << rank;
  }
  EXPECT_FALSE(std::filesystem::exists(testing::metadata_path(checkpoint)));
}

// The run: a BatchNorm trained on each rank's own batches under a GradientReducer,
// then saved. With the reducer's buffer broadcast (the default) the ranks' statistics
// agree and the save commits them; without it they drift apart and the save refuses.
TEST(DcpReplicatedMismatch, BatchNormStatisticsUnderAGradientReducerSaveOnlyWhenBroadcast) {
  for (const bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "broadcast_buffers(false)");
    const ScratchDir dir;
    const std::string checkpoint = dir.sub("ckpt");
    std::vector<std::string> messages(2);
    stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
      torch::nn::Linear linear(4, 3);
      torch::nn::BatchNorm1d norm(3);
      {
        const at::NoGradGuard no_grad;
        linear->weight.copy_((torch::arange(12, torch::kFloat).reshape({3, 4}) * 0.3).sin());
        linear->bias.zero_();
      }
      std::vector<at::Tensor> params = linear->parameters();
      for (const at::Tensor& p : norm->parameters()) params.push_back(p);
      dist::GradientReducer reducer(params, norm->buffers(), group,
                                    dist::GradientReducerOptions().broadcast_buffers(broadcast));
      for (int64_t step = 0; step < 2; ++step) {
        reducer.zero_grad();
        const at::Tensor x =
            (torch::arange(32, torch::kFloat).reshape({8, 4}) * 0.1 + static_cast<double>(group.rank() + 3 * step))
                .cos();
        norm->forward(linear->forward(x)).pow(2).sum().backward();
        reducer.synchronize();
      }
      StateDict state;
      for (const auto& item : norm->named_buffers()) state.insert("norm." + item.key(), item.value());
      try {
        save(state, checkpoint, group);
      } catch (const DistributedCheckpointError& e) {
        messages[static_cast<size_t>(group.rank())] = e.what();
      }
    });
    for (size_t rank = 0; rank < messages.size(); ++rank) {
      if (broadcast) {
        EXPECT_EQ(messages[rank], "") << "rank " << rank;
      } else {
        EXPECT_THAT(messages[rank], HasSubstr("checkpoint entry 'norm.running_mean' is replicated")) << "rank " << rank;
        EXPECT_THAT(messages[rank], HasSubstr("and 1 more copies of replicated boxes differ")) << "rank " << rank;
      }
    }
    EXPECT_EQ(std::filesystem::exists(testing::metadata_path(checkpoint)), broadcast);
  }
}

}  // namespace
}  // namespace stowage::dcp
