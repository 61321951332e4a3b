// CheckpointManager's policy for failed saves (issue 24): a failure is reported and the
// next due save tries again, the partial directory goes and the committed checkpoints
// stay; kStop and max_consecutive_failures throw; two ranks reach the same verdict;
// save_now commits the step a preempted loop is on.

#include "dcp/fault_injection_env.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

namespace stowage::dcp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScratchDir;
namespace fs = std::filesystem;

StateDict weights_of_step(int64_t step) {
  StateDict state;
  state.insert("w", torch::full({1024}, static_cast<double>(step)));
  return state;
}

std::vector<int64_t> steps_on_disk(const std::string& directory) {
  std::vector<int64_t> steps;
  for (const ManagedCheckpoint& checkpoint : list_checkpoints(directory)) {
    EXPECT_TRUE(checkpoint.committed) << checkpoint.path << " is left uncommitted";
    steps.push_back(checkpoint.step);
  }
  return steps;
}

class ThrowingStateful final : public Stateful {
 public:
  StateDict state_dict() override { throw Error("the user's state_dict() failed"); }
  void load_state_dict(const StateDict& /*state*/) override {}
};

TEST(DcpSaveFailure, AFailedSaveIsReportedItsDirectoryRemovedAndTheNextSaveCommits) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(0).env(&env));
  manager.save(1, weights_of_step(1));
  ASSERT_EQ(manager.wait().size(), 1u);
  env.fail(testing::Call::kWrite, 1);  // step 2's first data write
  manager.save(2, weights_of_step(2));
  const std::vector<SaveReport> failed = manager.wait();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].step, 2);
  EXPECT_FALSE(failed[0].committed);
  EXPECT_THAT(failed[0].error, HasSubstr("injected fault: cannot write"));
  EXPECT_FALSE(fs::exists(manager.checkpoint_path(2))) << "the partial checkpoint was left behind";
  manager.save(3, weights_of_step(3));
  const std::vector<SaveReport> next = manager.wait();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_TRUE(next[0].committed) << next[0].error;
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(1, 3));
  StateDict restored = weights_of_step(0);
  EXPECT_EQ(manager.restore(restored), 3);
  EXPECT_TRUE(torch::equal(restored.at("w").toTensor(), weights_of_step(3).at("w").toTensor()));
}

TEST(DcpSaveFailure, AStatefulWhoseStateDictThrowsIsAReportedFailure) {
  const ScratchDir dir;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1));
  StateDict state = weights_of_step(1);
  state.insert("user", as_ivalue(c10::make_intrusive<ThrowingStateful>()));
  manager.save(1, state);
  const std::vector<SaveReport> reports = manager.wait();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_FALSE(reports[0].committed);
  EXPECT_THAT(reports[0].error, HasSubstr("the user's state_dict() failed"));
  EXPECT_TRUE(steps_on_disk(dir.path()).empty());
}

TEST(DcpSaveFailure, WithKStopTheFailureIsThrownOnceAndTheCommittedCheckpointsStay) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(1).env(&env).on_save_failure(
                                            SaveFailurePolicy::kStop));
  manager.save(1, weights_of_step(1));
  manager.wait();
  env.fail(testing::Call::kRename, 1);  // step 2's commit
  manager.save(2, weights_of_step(2));
  try {
    manager.wait();
    ADD_FAILURE() << "a failed save was not thrown";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("injected fault: cannot rename"));
  }
  EXPECT_TRUE(manager.wait().empty());  // thrown once
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(1));
}

TEST(DcpSaveFailure, TheFailureThatMakesMaxConsecutiveFailuresInARowIsThrown) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).env(&env).max_consecutive_failures(2));
  const auto save_failing = [&](int64_t step) {
    env.fail(testing::Call::kWrite, 1);
    manager.save(step, weights_of_step(step));
    return manager.wait();
  };
  ASSERT_EQ(save_failing(1).size(), 1u);
  env.fail(testing::Call::kWrite, 0);
  manager.save(2, weights_of_step(2));
  ASSERT_TRUE(manager.wait().at(0).committed);  // a commit ends the run of failures
  ASSERT_EQ(save_failing(3).size(), 1u);
  try {
    save_failing(4);
    ADD_FAILURE() << "two failures in a row were not thrown";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 saves failed in a row (steps 3, 4); the last one's error: injected fault"));
  }
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(2));
}

TEST(DcpSaveFailure, ARemovalOfOldCheckpointsThatFailsIsReportedWithTheCommit) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(1).env(&env));
  manager.save(1, weights_of_step(1));
  manager.wait();
  env.fail(testing::Call::kUnlink, 1);  // removing step 1 once step 2 commits
  manager.save(2, weights_of_step(2));
  const std::vector<SaveReport> reports = manager.wait();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].committed);
  EXPECT_THAT(reports[0].error, HasSubstr("injected fault: cannot unlink"));
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(1, 2));
}

TEST(DcpSaveFailure, ACheckpointDirectoryDeletedDuringASaveCostsThatSaveAtMost) {
  const ScratchDir dir;
  const std::string checkpoints = dir.sub("checkpoints");
  CheckpointManager manager(checkpoints, CheckpointManagerOptions().save_every(1));
  manager.save(1, weights_of_step(1));
  fs::remove_all(checkpoints);                           // while step 1 is in flight
  const std::vector<SaveReport> first = manager.wait();  // committed or failed: reported either way
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].step, 1);
  manager.save(2, weights_of_step(2));
  const std::vector<SaveReport> reports = manager.wait();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].committed) << reports[0].error;
  StateDict restored = weights_of_step(0);
  EXPECT_EQ(manager.restore(restored), 2);
}

TEST(DcpSaveFailure, SaveNowCommitsTheStepOnceAndRetriesAFailedOne) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(5).keep_last(0).env(&env));
  manager.save(5, weights_of_step(5));
  std::vector<SaveReport> reports = manager.save_now(5, weights_of_step(5));  // in flight: waited for
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].committed);
  EXPECT_TRUE(manager.save_now(5, weights_of_step(5)).empty());  // committed already
  env.fail(testing::Call::kWrite, 1);
  manager.save(10, weights_of_step(10));
  reports = manager.save_now(10, weights_of_step(10));  // the failed save of step 10, then step 10 again
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_FALSE(reports[0].committed);
  EXPECT_TRUE(reports[1].committed) << reports[1].error;
  EXPECT_EQ(reports[1].step, 10);
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(5, 10));
  EXPECT_THROW(manager.save_now(7, weights_of_step(7)), InvalidArgument);
}

TEST(DcpSaveFailure, ANegativeLimitIsRefusedByName) {
  const ScratchDir dir;
  try {
    const CheckpointManager manager(dir.path(), CheckpointManagerOptions().max_consecutive_failures(-1));
    ADD_FAILURE() << "accepted max_consecutive_failures -1";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("max_consecutive_failures must be >= 0, got -1"));
  }
}

// Rank 1 alone cannot write: both ranks get the failure of step 2, keep going, and
// commit step 3 together; neither stops while the other goes on.
TEST(DcpSaveFailure, TwoRanksReachTheSameVerdictWhenOneRankFails) {
  const ScratchDir dir;
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    testing::FaultInjectionEnv env;
    CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(0).env(&env), group);
    const auto own_state = [&](int64_t step) {
      StateDict state;
      state.insert(fmt::format("rank{}", group.rank()), torch::full({256}, static_cast<double>(step)));
      return state;
    };
    manager.save(1, own_state(1));
    ASSERT_TRUE(manager.wait().at(0).committed);
    if (group.rank() == 1) env.fail(testing::Call::kWrite, 1);
    manager.save(2, own_state(2));
    const std::vector<SaveReport> failed = manager.wait();
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_FALSE(failed[0].committed) << "rank " << group.rank();
    EXPECT_THAT(failed[0].error, HasSubstr("injected fault: cannot write")) << "rank " << group.rank();
    env.fail(testing::Call::kWrite, 0);
    manager.save(3, own_state(3));
    EXPECT_TRUE(manager.wait().at(0).committed) << "rank " << group.rank();
  });
  EXPECT_THAT(steps_on_disk(dir.path()), ElementsAre(1, 3));
}

}  // namespace
}  // namespace stowage::dcp
