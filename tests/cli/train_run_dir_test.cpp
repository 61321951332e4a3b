// What a new user's second trial of `stowage train` found (issue 36), each refused with a
// clear error before anything is changed: a fresh run into a used run directory, a
// resume that changes what shapes the model or the data, a batch that does not split
// over the ranks (once, before any rank starts), a checkpoint to start from that is not
// there; and bad arguments exit 2.
#include "cli/train_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace stowage::testing {
namespace {

using ::testing::HasSubstr;

int64_t lines_of(const fs::path& file) {
  std::ifstream in(file);
  int64_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

int64_t occurrences(const std::string& text, const std::string& part) {
  int64_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(TrainRunDirectory, AFreshRunIntoAUsedOneIsRefusedAndTheOldRunIsUntouched) {
  RunDir dir;
  ASSERT_EQ(train(dir, "--steps 2 --ckpt-every 2").status, 0);
  const int64_t metrics = lines_of(dir.path / "metrics.jsonl");
  const auto again = train(dir, "--steps 4 --ckpt-every 2");
  EXPECT_EQ(again.status, 2) << again.output;
  EXPECT_THAT(again.output, HasSubstr("holds a run already (run.json, metrics.jsonl and 1 committed checkpoint (the "
                                      "latest of step 2)): resume it"));
  EXPECT_EQ(lines_of(dir.path / "metrics.jsonl"), metrics);
  EXPECT_FALSE(fs::exists(dir.path / "checkpoints" / "step-00000004"));
}

TEST(TrainRunDirectory, AResumeThatChangesTheModelOrTheDataIsRefusedNamingTheSetting) {
  RunDir dir;
  // kSmall without its --heads, --layers and --batch.
  const auto train = [&](const std::string& sizes, const std::string& args) {
    return run_command(stowage_binary() + " train --run-dir " + dir.str() +
                       " --width 64 --seq-len 32 --threads 1 --log-every 1000 " + sizes + " " + args);
  };
  const std::string sizes = "--heads 2 --layers 2 --batch 8";
  ASSERT_EQ(train(sizes, "--steps 2 --ckpt-every 2").status, 0);
  // The same tensors with 1 head, other ones with 3 layers.
  const auto heads = train("--heads 1 --layers 2 --batch 8", "--steps 4 --resume");
  EXPECT_EQ(heads.status, 2) << heads.output;
  EXPECT_THAT(heads.output, HasSubstr("--heads: 2 then, 1 now"));
  EXPECT_THAT(heads.output, HasSubstr("--allow-config-change"));
  const auto layers_and_batch = train("--heads 2 --layers 3 --batch 4", "--steps 4 --resume");
  EXPECT_EQ(layers_and_batch.status, 2) << layers_and_batch.output;
  EXPECT_THAT(layers_and_batch.output, HasSubstr("--batch: 8 then, 4 now; --layers: 2 then, 3 now"));
  EXPECT_FALSE(fs::exists(dir.path / "checkpoints" / "step-00000004"));
  const auto allowed = train("--heads 1 --layers 2 --batch 8", "--steps 4 --resume --allow-config-change");
  EXPECT_EQ(allowed.status, 0) << allowed.output;
  EXPECT_THAT(allowed.output, HasSubstr("resume: from"));
}

TEST(TrainFlags, ABatchThatDoesNotSplitOverTheRanksIsOneErrorBeforeAnyRankStarts) {
  RunDir dir;
  const auto result = train(dir, "--steps 2 --nproc 3");  // kSmall's --batch 8
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_EQ(occurrences(result.output, "--batch 8 (the global batch) does not split evenly over 3 ranks"), 1)
      << result.output;
  EXPECT_FALSE(fs::exists(dir.path));
}

TEST(TrainFlags, AMissingCheckpointToStartFromIsNamedBeforeAnythingIsCreated) {
  RunDir dir;
  const auto result = train(dir, "--steps 2 --resume-from /nonexistent/step-00000010");
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr("--resume-from /nonexistent/step-00000010: no such checkpoint"));
  EXPECT_FALSE(fs::exists(dir.path));
}

TEST(TrainFlags, BadArgumentsExitTwoAndHelpZero) {
  RunDir dir;
  for (const std::string& args : {"--steps abc", "--no-such-flag", "--zero-stage 3"}) {
    SCOPED_TRACE(args);
    const auto result = train(dir, args);
    EXPECT_EQ(result.status, 2) << result.output;
    EXPECT_FALSE(fs::exists(dir.path));
  }
  const auto help = run_command(stowage_binary() + " train --help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_THAT(help.output, HasSubstr("sim or sim:N"));
}

}  // namespace
}  // namespace stowage::testing
