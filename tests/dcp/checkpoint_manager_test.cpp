// CheckpointManager over real directories: what it saves and keeps, what it restores,
// the snapshot taken before the caller changes the state, failures, two ranks; and
// dcp::verify of a good and a corrupt checkpoint.

#include "dcp/fault_injection_env.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/verify.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace stowage::dcp {
namespace {

using testing::data_files;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::metadata_path;
using testing::read_file;
using testing::ScratchDir;
using testing::state_of;
using testing::write_file;

std::vector<int64_t> committed_steps(const std::string& directory) {
  std::vector<int64_t> steps;
  for (const ManagedCheckpoint& checkpoint : list_checkpoints(directory)) {
    if (checkpoint.committed) steps.push_back(checkpoint.step);
  }
  return steps;
}

// A training loop's state: "w" holds the step it was updated at.
StateDict step_state(const at::Tensor& w) {
  StateDict state;
  state.insert("w", w);
  return state;
}

TEST(DcpCheckpointManager, SavesEveryKStepsAndKeepsTheLastNAndEveryMth) {
  const ScratchDir dir;
  CheckpointManager manager(dir.sub("run"), CheckpointManagerOptions().save_every(2).keep_last(2).keep_every(4));
  at::Tensor w = torch::zeros({1000});
  std::vector<int64_t> reported;
  for (int64_t step = 1; step <= 10; ++step) {
    manager.wait_for_staging();  // before the update changes what the save copies
    w.fill_(static_cast<double>(step));
    EXPECT_EQ(manager.save(step, step_state(w)), step % 2 == 0);
    for (const SaveReport& save : manager.poll()) reported.push_back(save.step);
  }
  for (const SaveReport& save : manager.wait()) {
    reported.push_back(save.step);
    EXPECT_EQ(save.bytes, 4000);
    EXPECT_EQ(save.path, manager.checkpoint_path(save.step));
    EXPECT_GT(save.commit_s, 0);
  }
  EXPECT_THAT(reported, ElementsAre(2, 4, 6, 8, 10));
  EXPECT_THAT(committed_steps(dir.sub("run")), ElementsAre(4, 8, 10));
  ASSERT_TRUE(manager.latest());
  EXPECT_EQ(manager.latest()->step, 10);
  EXPECT_EQ(manager.checkpoint_path(10), dir.sub("run") + "/step-00000010");
}

TEST(DcpCheckpointManager, ASaveHoldsTheStateAsItWasWhenSaveWasCalled) {
  const ScratchDir dir;
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1));
  at::Tensor w = torch::full({1 << 16}, 1.0);
  manager.save(1, step_state(w));
  manager.wait_for_staging();
  w.fill_(2.0);  // the next step's update
  manager.wait();
  StateDict loaded = step_state(torch::zeros({1 << 16}));
  EXPECT_EQ(manager.restore(loaded), 1);
  EXPECT_TRUE(torch::equal(loaded.at("w").toTensor(), torch::full({1 << 16}, 1.0)));
}

TEST(DcpCheckpointManager, RestoresTheNewestCommittedCheckpointAndRemovesLeftovers) {
  const ScratchDir dir;
  {
    CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(0));
    for (int64_t step = 1; step <= 3; ++step) manager.save(step, step_state(torch::full({8}, double(step))));
    manager.wait();
  }
  // The remains of a save that never committed, newer than the last commit.
  std::filesystem::create_directories(dir.sub("step-00000004"));
  write_file(dir.sub("step-00000004/data-0-0"), "partial");
  std::filesystem::create_directories(dir.sub("not-a-step"));
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 4u);  // listing changes nothing
  EXPECT_FALSE(list_checkpoints(dir.path()).back().committed);

  CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1));
  EXPECT_THAT(committed_steps(dir.path()), ElementsAre(1, 2, 3));
  EXPECT_EQ(list_checkpoints(dir.path()).size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir.sub("not-a-step")));
  StateDict state = step_state(torch::zeros({8}));
  EXPECT_EQ(manager.restore(state), 3);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({8}, 3.0)));
  // Saving continues after the restored step only.
  EXPECT_THROW(manager.save(3, state), InvalidArgument);
  EXPECT_TRUE(manager.save(4, state));
  manager.wait();

  const ScratchDir empty;
  CheckpointManager fresh(empty.path());
  StateDict untouched = step_state(torch::zeros({8}));
  EXPECT_EQ(fresh.restore(untouched), std::nullopt);
  EXPECT_TRUE(torch::equal(untouched.at("w").toTensor(), torch::zeros({8})));
}

TEST(DcpCheckpointManager, AFailedSaveIsReportedOnceAndKeepsThePreviousCheckpoints) {
  const ScratchDir dir;
  CheckpointManager manager(
      dir.path(), CheckpointManagerOptions().save_every(1).keep_last(1).on_save_failure(SaveFailurePolicy::kStop));
  manager.save(1, step_state(torch::full({8}, 1.0)));
  manager.wait();
  StateDict bad;
  bad.insert("w", at::Tensor());
  try {
    manager.save(2, bad);
    manager.wait();
    ADD_FAILURE() << "saved an undefined tensor";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'w'"));
  }
  EXPECT_TRUE(manager.wait().empty());  // reported once
  EXPECT_THAT(committed_steps(dir.path()), ElementsAre(1));
  StateDict state = step_state(torch::zeros({8}));
  EXPECT_EQ(manager.restore(state), 1);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({8}, 1.0)));
}

TEST(DcpCheckpointManager, NegativeOptionsAreRefusedByName) {
  const ScratchDir dir;
  try {
    const CheckpointManager manager(dir.path(), CheckpointManagerOptions().keep_last(-1));
    ADD_FAILURE() << "accepted keep_last -1";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("keep_last must be >= 0, got -1"));
  }
  EXPECT_THROW(CheckpointManager(dir.path(), CheckpointManagerOptions().save_every(-2)), InvalidArgument);
}

TEST(DcpCheckpointManager, ADirectoryItCannotCreateIsAnIoErrorNamingIt) {
  const ScratchDir dir;
  write_file(dir.sub("file"), "not a directory");
  try {
    const CheckpointManager manager(dir.sub("file/run"));
    ADD_FAILURE() << "made a checkpoint directory under a file";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), dir.sub("file/run"));
    EXPECT_EQ(e.operation(), "mkdir");
    EXPECT_EQ(e.error_number(), ENOTDIR) << e.what();
  }
}

// Every file-system call of the manager and of its writers and readers goes through
// its env: a failure to remove an old checkpoint is reported by the wait() that pruned,
// naming it, and the checkpoints stay loadable.
TEST(DcpCheckpointManager, GoesThroughItsEnvAndReportsARemovalItCouldNotMake) {
  const ScratchDir dir;
  testing::FaultInjectionEnv env;
  CheckpointManagerOptions options = CheckpointManagerOptions().save_every(1).keep_last(1).env(&env);
  env.fail(testing::Call::kUnlink, 1);  // the first removal: step 1's, once step 2 commits
  CheckpointManager manager(dir.path(), options);
  manager.save(1, step_state(torch::full({10}, 1.0)));
  manager.wait();
  manager.save(2, step_state(torch::full({10}, 2.0)));
  const std::vector<SaveReport> reports = manager.wait();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].committed);
  EXPECT_THAT(reports[0].error, HasSubstr("cannot unlink '" + manager.checkpoint_path(1)));
  for (testing::Call call : {testing::Call::kMkdir, testing::Call::kList, testing::Call::kOpen, testing::Call::kWrite,
                             testing::Call::kRename}) {
    EXPECT_GT(env.count(call), 0) << testing::operation_of(call);
  }
  EXPECT_THAT(committed_steps(dir.path()), ElementsAre(1, 2));
  StateDict restored = step_state(torch::zeros({10}));
  CheckpointManager resumed(dir.path(), options);
  EXPECT_EQ(resumed.restore(restored), 2);
  EXPECT_TRUE(torch::equal(restored.at("w").toTensor(), torch::full({10}, 2.0)));
  EXPECT_GT(env.count(testing::Call::kMmap), 0);  // restore read through the env too
}

// A directory that exists but cannot be listed is an error, not "no checkpoints": a
// restore must not start from scratch over checkpoints it could not see.
TEST(DcpCheckpointManager, ADirectoryThatCannotBeListedIsAnIoError) {
  const ScratchDir dir;
  EXPECT_TRUE(list_checkpoints(dir.sub("absent")).empty());
  testing::FaultInjectionEnv env;
  env.fail(testing::Call::kList, 1);
  try {
    list_checkpoints(dir.path(), env);
    ADD_FAILURE() << "a listing that failed gave a result";
  } catch (const IoError& e) {
    EXPECT_EQ(e.operation(), "list");
    EXPECT_EQ(e.path(), dir.path());
  }
}

TEST(DcpCheckpointManager, AStepDirectoryMayBeASymbolicLinkToACheckpoint) {
  const ScratchDir elsewhere;
  {
    CheckpointManager manager(elsewhere.path(), CheckpointManagerOptions().save_every(1).keep_last(0));
    for (int64_t step = 1; step <= 2; ++step) manager.save(step, step_state(torch::full({4}, double(step))));
    manager.wait();
  }
  const ScratchDir dir;
  std::filesystem::create_directory_symlink(elsewhere.sub("step-00000002"), dir.sub("step-00000007"));
  write_file(dir.sub("a-file"), "not a checkpoint");
  std::filesystem::create_symlink(dir.sub("a-file"), dir.sub("step-00000008"));
  const std::vector<ManagedCheckpoint> listed = list_checkpoints(dir.path());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].step, 7);
  EXPECT_TRUE(listed[0].committed);

  CheckpointManager manager(dir.path());
  StateDict state = step_state(torch::zeros({4}));
  EXPECT_EQ(manager.restore(state), 7);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({4}, 2.0)));
}

TEST(DcpCheckpointManager, TwoRanksSaveAndRestoreTogether) {
  const ScratchDir dir;
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    const double rank = static_cast<double>(group.rank());
    {
      CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(1), group);
      for (int64_t step = 1; step <= 3; ++step) {
        StateDict state = step_state(torch::full({8}, double(step)));
        state.insert(fmt::format("rank{}", group.rank()), torch::full({4}, rank + 10 * step));
        manager.save(step, state);
      }
      manager.wait();
    }
    CheckpointManager manager(dir.path(), {}, group);
    StateDict state = step_state(torch::zeros({8}));
    state.insert(fmt::format("rank{}", group.rank()), torch::zeros({4}));
    EXPECT_EQ(manager.restore(state), 3);
    EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({8}, 3.0)));
    EXPECT_TRUE(torch::equal(state.at(fmt::format("rank{}", group.rank())).toTensor(), torch::full({4}, rank + 30)));
  });
  EXPECT_THAT(committed_steps(dir.path()), ElementsAre(3));
}

// Three committed checkpoints, "w" holding its step in each; returns the directory's path.
void save_steps_one_to_three(const std::string& directory) {
  CheckpointManager manager(directory, CheckpointManagerOptions().save_every(1).keep_last(0));
  for (int64_t step = 1; step <= 3; ++step) manager.save(step, step_state(torch::full({64}, double(step))));
  manager.wait();
}

void flip_bytes_of_data_files(const std::string& checkpoint) {
  for (const std::string& name : data_files(checkpoint)) {
    std::string bytes = read_file(checkpoint + "/" + name);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
    write_file(checkpoint + "/" + name, bytes);
  }
}

void truncate_data_files(const std::string& checkpoint) {
  for (const std::string& name : data_files(checkpoint)) {
    std::filesystem::resize_file(checkpoint + "/" + name, 10);
  }
}

void truncate_metadata(const std::string& checkpoint) {
  std::filesystem::resize_file(metadata_path(checkpoint), 7);
}

TEST(DcpCheckpointManager, RestoreFallsBackPastAnUnreadableNewestCheckpoint) {
  const std::vector<std::pair<const char*, void (*)(const std::string&)>> damages = {
      {"corrupt data", flip_bytes_of_data_files},
      {"truncated data", truncate_data_files},
      {"truncated metadata", truncate_metadata},
  };
  for (const auto& [what, damage] : damages) {
    SCOPED_TRACE(what);
    const ScratchDir dir;
    save_steps_one_to_three(dir.path());
    CheckpointManager manager(dir.path());
    damage(manager.checkpoint_path(3));
    StateDict state = step_state(torch::zeros({64}));
    std::vector<SkippedCheckpoint> skipped;
    EXPECT_EQ(manager.restore(state, {}, &skipped), 2);
    EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, 2.0)));
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].step, 3);
    EXPECT_EQ(skipped[0].path, manager.checkpoint_path(3));
    EXPECT_FALSE(skipped[0].error.empty());
    EXPECT_THROW(manager.save(2, state, /*force=*/true), InvalidArgument);  // saving goes on after the restored step
  }
}

TEST(DcpCheckpointManager, ACheckpointWithoutMetadataIsUncommittedAndNotTried) {
  const ScratchDir dir;
  save_steps_one_to_three(dir.path());
  std::filesystem::remove(metadata_path(dir.sub("step-00000003")));
  CheckpointManager manager(dir.path());
  StateDict state = step_state(torch::zeros({64}));
  std::vector<SkippedCheckpoint> skipped;
  EXPECT_EQ(manager.restore(state, {}, &skipped), 2);
  EXPECT_TRUE(skipped.empty());
}

TEST(DcpCheckpointManager, WhenNoCheckpointCanBeReadRestoreThrowsAndChangesNothing) {
  const ScratchDir dir;
  save_steps_one_to_three(dir.path());
  CheckpointManager manager(dir.path());
  for (int64_t step = 1; step <= 3; ++step) flip_bytes_of_data_files(manager.checkpoint_path(step));
  StateDict state = step_state(torch::full({64}, -1.0));
  std::vector<SkippedCheckpoint> skipped;
  try {
    manager.restore(state, {}, &skipped);
    ADD_FAILURE() << "restored a corrupt checkpoint";
  } catch (const CorruptionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("none of the committed checkpoints"));
    EXPECT_THAT(e.what(), HasSubstr("steps 3, 2, 1"));
  }
  EXPECT_EQ(skipped.size(), 3u);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, -1.0)));
}

TEST(DcpCheckpointManager, WithoutFallBackTheNewestCheckpointsErrorIsThrown) {
  const ScratchDir dir;
  save_steps_one_to_three(dir.path());
  CheckpointManager manager(dir.path(), CheckpointManagerOptions().restore_falls_back(false));
  flip_bytes_of_data_files(manager.checkpoint_path(3));
  StateDict state = step_state(torch::full({64}, -1.0));
  EXPECT_THROW(manager.restore(state), CorruptionError);
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, -1.0)));
}

TEST(DcpCheckpointManager, AStateThatDoesNotMatchIsNoReasonToFallBack) {
  const ScratchDir dir;
  save_steps_one_to_three(dir.path());
  CheckpointManager manager(dir.path());
  StateDict state = step_state(torch::zeros({65}));
  std::vector<SkippedCheckpoint> skipped;
  EXPECT_THROW(manager.restore(state, {}, &skipped), InvalidArgument);
  EXPECT_TRUE(skipped.empty());
}

// A Stateful over one tensor that fails where it is told to, as the swap optimizer's
// disk tier fails on a read-only file system: with an error about a file of its own.
class FailingStateful final : public Stateful {
 public:
  enum class FailsIn { kNothing, kCheck, kLoad };
  StateDict state_dict() override { return state_of({{"value", value}}); }
  void check_load_state_dict(const StateDict& /*state*/) override {
    ++checks;
    if (fails_in == FailsIn::kCheck) fail();
  }
  void load_state_dict(const StateDict& /*state*/) override {
    ++loads;
    if (fails_in == FailsIn::kLoad) fail();
  }
  at::Tensor value = torch::zeros({4});
  FailsIn fails_in = FailsIn::kNothing;
  std::function<void()> fail;
  int checks = 0;
  int loads = 0;
};

constexpr const char* kScratchFile = "/read-only/swap/scratch-float32";
const std::string kCannotCreateScratch =
    fmt::format("Swap optimizer disk tier: cannot create the scratch file '{}': Read-only file system", kScratchFile);

void fail_to_create_the_scratch_file() {
  throw IoError(kCannotCreateScratch, kScratchFile, "create", EROFS);
}

// Two intact committed checkpoints, 10 and 20, of "w" and a FailingStateful "swap", each
// holding its step.
void save_steps_ten_and_twenty(const std::string& directory) {
  CheckpointManager manager(directory, CheckpointManagerOptions().save_every(10).keep_last(0));
  for (const int64_t step : {10, 20}) {
    auto swap = c10::make_intrusive<FailingStateful>();
    swap->value.fill_(double(step));
    manager.save(step, state_of({{"w", torch::full({64}, double(step))}, {"swap", as_ivalue(swap)}}));
    manager.wait();
  }
}

// Falling back is for a checkpoint that cannot be read: a Stateful that fails, on a file
// of its own, fails the restore at once with its error as raised, and no checkpoint is
// skipped.
TEST(DcpCheckpointManager, AStatefulThatFailsIsNoReasonToFallBack) {
  using FailsIn = FailingStateful::FailsIn;
  struct Case {
    const char* what;
    FailsIn fails_in;
    std::function<void()> fail;
    ErrorKind kind;
    std::string message;
  };
  const std::string corrupt_scratch = fmt::format("the scratch file '{}' is corrupt", kScratchFile);
  const std::vector<Case> cases = {
      {"an IoError in check_load_state_dict", FailsIn::kCheck, fail_to_create_the_scratch_file, ErrorKind::kIo,
       kCannotCreateScratch},
      {"an IoError in load_state_dict", FailsIn::kLoad, fail_to_create_the_scratch_file, ErrorKind::kIo,
       kCannotCreateScratch},
      {"a CorruptionError of its own file in load_state_dict", FailsIn::kLoad,
       [&] { throw CorruptionError(corrupt_scratch, "", kScratchFile, 0); }, ErrorKind::kCorruption, corrupt_scratch},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.what);
    const ScratchDir dir;
    save_steps_ten_and_twenty(dir.path());
    CheckpointManager manager(dir.path());
    auto swap = c10::make_intrusive<FailingStateful>();
    swap->fails_in = test.fails_in;
    swap->fail = test.fail;
    StateDict state = state_of({{"w", torch::full({64}, -1.0)}, {"swap", as_ivalue(swap)}});
    std::vector<SkippedCheckpoint> skipped;
    try {
      manager.restore(state, {}, &skipped);
      ADD_FAILURE() << "restored past a Stateful that failed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), test.kind);
      EXPECT_EQ(e.what(), test.message);  // as raised
    }
    EXPECT_TRUE(skipped.empty());
    EXPECT_EQ(swap->checks, 1);  // step 20's load alone: step 10 was not tried
    // As dcp::load leaves it: a failed check changes nothing; load_state_dict comes
    // after the other entries are filled.
    const double w = test.fails_in == FailsIn::kCheck ? -1.0 : 20.0;
    EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, w)));
  }
}

// A newer checkpoint that cannot be read is skipped, and reported so, even when the
// older one then fails for its state.
TEST(DcpCheckpointManager, ACheckpointSkippedBeforeTheStateFailsIsReported) {
  const ScratchDir dir;
  save_steps_ten_and_twenty(dir.path());
  CheckpointManager manager(dir.path());
  truncate_metadata(manager.checkpoint_path(20));
  auto swap = c10::make_intrusive<FailingStateful>();
  swap->fails_in = FailingStateful::FailsIn::kCheck;
  swap->fail = fail_to_create_the_scratch_file;
  StateDict state = state_of({{"w", torch::full({64}, -1.0)}, {"swap", as_ivalue(swap)}});
  std::vector<SkippedCheckpoint> skipped;
  try {
    manager.restore(state, {}, &skipped);
    ADD_FAILURE() << "restored past a Stateful that failed";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), kScratchFile);
    EXPECT_EQ(e.what(), kCannotCreateScratch);
  }
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].step, 20);
  EXPECT_EQ(swap->checks, 1);  // step 10's: step 20's metadata failed before
  EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, -1.0)));
}

// With a group, one rank's Stateful that fails fails the restore on every rank at once.
TEST(DcpCheckpointManager, TwoRanksThrowTogetherWhenOneRanksStatefulFails) {
  const ScratchDir dir;
  save_steps_ten_and_twenty(dir.path());
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    CheckpointManager manager(dir.path(), {}, group);
    auto swap = c10::make_intrusive<FailingStateful>();
    if (group.rank() == 1) {
      swap->fails_in = FailingStateful::FailsIn::kCheck;
      swap->fail = fail_to_create_the_scratch_file;
    }
    StateDict state = state_of({{"w", torch::full({64}, -1.0)}, {"swap", as_ivalue(swap)}});
    std::vector<SkippedCheckpoint> skipped;
    try {
      manager.restore(state, {}, &skipped);
      ADD_FAILURE() << "restored past a Stateful that failed";
    } catch (const DistributedCheckpointError& e) {
      ASSERT_EQ(e.failures().size(), 1u);
      const RankFailure& failure = e.failures().begin()->second;
      EXPECT_EQ(e.failures().begin()->first, 1);
      EXPECT_EQ(failure.kind, ErrorKind::kIo);
      EXPECT_EQ(failure.path, kScratchFile);
      EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("none of the committed checkpoints")));
    }
    EXPECT_TRUE(skipped.empty());
    EXPECT_EQ(swap->checks, 1);  // step 20's load alone
    EXPECT_TRUE(torch::equal(state.at("w").toTensor(), torch::full({64}, -1.0)));
  });
}

TEST(DcpCheckpointManager, TwoRanksFallBackTogetherWhenOneRanksFileIsCorrupt) {
  const ScratchDir dir;
  stowage::testing::run_ranks(2, [&](const dist::ProcessGroup& group) {
    const auto own_state = [&](double value) {
      StateDict state;
      state.insert(fmt::format("rank{}", group.rank()), torch::full({16}, value));
      return state;
    };
    {
      CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(1).keep_last(0), group);
      for (int64_t step = 1; step <= 3; ++step) manager.save(step, own_state(double(10 * group.rank() + step)));
      manager.wait();
    }
    CheckpointManager manager(dir.path(), {}, group);
    if (group.rank() == 1) {  // rank 1's own file of the newest checkpoint
      for (const std::string& name : data_files(manager.checkpoint_path(3))) {
        if (name.find("-r1") == std::string::npos) continue;  // data-<save id>-r<rank>...
        std::string bytes = read_file(manager.checkpoint_path(3) + "/" + name);
        bytes[0] = static_cast<char>(bytes[0] ^ 0x5a);
        write_file(manager.checkpoint_path(3) + "/" + name, bytes);
      }
    }
    group.barrier();
    StateDict state = own_state(0);
    std::vector<SkippedCheckpoint> skipped;
    EXPECT_EQ(manager.restore(state, {}, &skipped), 2);
    EXPECT_TRUE(torch::equal(state.at(fmt::format("rank{}", group.rank())).toTensor(),
                             torch::full({16}, double(10 * group.rank() + 2))));
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].step, 3);
  });
}

TEST(DcpVerify, AGoodCheckpointVerifiesEveryChunkAndACorruptOneNamesTheEntry) {
  const ScratchDir dir;
  StateDict state;
  state.insert("a", torch::arange(256, torch::kFloat));
  state.insert("b", torch::ones({64}, torch::kDouble));
  save(state, dir.path());
  FileSystemReader reader(dir.path());
  const VerifyReport good = verify(reader);
  EXPECT_TRUE(good.ok()) << good.error;
  EXPECT_EQ(good.chunks_verified, 2);
  EXPECT_EQ(good.bytes_verified, 256 * 4 + 64 * 8);

  for (const std::string& name : data_files(dir.path())) {
    std::string bytes = read_file(dir.sub(name));
    for (char& byte : bytes) byte = static_cast<char>(byte ^ 0x5a);
    write_file(dir.sub(name), bytes);
  }
  FileSystemReader corrupt_reader(dir.path());
  const VerifyReport corrupt = verify(corrupt_reader);
  EXPECT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.chunks_verified, 0);
  EXPECT_THAT(corrupt.error, ::testing::AnyOf(HasSubstr("'a'"), HasSubstr("'b'")));

  std::filesystem::remove(metadata_path(dir.path()));
  FileSystemReader uncommitted_reader(dir.path());
  const VerifyReport uncommitted = verify(uncommitted_reader);
  EXPECT_FALSE(uncommitted.ok());
  EXPECT_EQ(uncommitted.chunks_verified, 0);
}

// The writer aligns an empty chunk's offset without writing a byte: the last entry's
// may point past its file's end, and reads nothing there.
TEST(DcpVerify, AnEmptyTensorAfterTheLastBytesVerifies) {
  const ScratchDir dir;
  StateDict state;
  state.insert("a", torch::ones({3}));
  state.insert("empty", torch::empty({0, 4}));
  save(state, dir.path());
  FileSystemReader reader(dir.path());
  const Metadata metadata = reader.read_metadata();
  const StorageLocation& empty = metadata.find("empty")->chunks.at(0).location;
  ASSERT_GT(empty.offset, static_cast<int64_t>(std::filesystem::file_size(dir.sub(empty.file))));
  const VerifyReport report = verify(reader);
  EXPECT_TRUE(report.ok()) << report.error;
  EXPECT_EQ(report.chunks_verified, 2);
  EXPECT_EQ(report.bytes_verified, 12);
}

}  // namespace
}  // namespace stowage::dcp
