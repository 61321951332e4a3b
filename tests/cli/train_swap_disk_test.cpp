// `stowage train --swap-to disk:DIR`: the optimizer state swapped through scratch files
// trains, checkpoints and resumes to exactly what the host tier gives.

#include "cli/train_util.h"

#include <gmock/gmock.h>

namespace stowage::testing {
namespace {

TEST(TrainSwapDisk, DiskTierRunResumedEndsBitIdenticalToAHostTierRun) {
  RunDir host, disk, swap_dir;
  fs::create_directories(swap_dir.path);
  const std::string to_disk = " --swap-to disk:" + swap_dir.str() + " --swap-host-budget 1MiB";
  ASSERT_EQ(train(host, "--steps 8 --ckpt-every 4").status, 0);
  const auto first = train(disk, "--steps 4 --ckpt-every 4" + to_disk);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_THAT(first.output, ::testing::HasSubstr("to disk:" + swap_dir.str()));
  const auto resumed = train(disk, "--steps 8 --ckpt-every 4 --resume" + to_disk);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_same_checkpoint(step_dir(host, 8), step_dir(disk, 8));
  // The scratch files were unlinked as they were made: nothing is left behind.
  EXPECT_TRUE(fs::is_empty(swap_dir.path));
}

TEST(TrainSwapDisk, BadSwapOptionsAreNamed) {
  RunDir dir;
  const auto bad_tier = train(dir, "--steps 1 --swap-to tape");
  EXPECT_NE(bad_tier.status, 0);
  EXPECT_THAT(bad_tier.output, ::testing::HasSubstr("--swap-to 'tape': expected 'host' or 'disk:DIR'"));
  const auto budget_on_host = train(dir, "--steps 1 --swap-host-budget 1MiB");
  EXPECT_NE(budget_on_host.status, 0);
  EXPECT_THAT(budget_on_host.output, ::testing::HasSubstr("host_budget_bytes (1048576) bounds the disk tier's buffers, "
                                                          "but swap_dir is empty (host tier)"));
  const auto missing_dir = train(dir, "--steps 1 --swap-to disk:/nonexistent/stowage");
  EXPECT_NE(missing_dir.status, 0);
  EXPECT_THAT(missing_dir.output,
              ::testing::HasSubstr("--swap-to disk:/nonexistent/stowage: '/nonexistent/stowage' is not a directory"));
  const auto small_budget = train(dir, "--steps 1 --swap-to disk:/tmp --swap-host-budget 1KiB");
  EXPECT_NE(small_budget.status, 0);
  EXPECT_THAT(small_budget.output, ::testing::HasSubstr("--swap-host-budget 1KiB is below the 512.0 KiB the disk "
                                                        "tier needs for this model"));
  const auto no_swap = train(dir, "--steps 1 --swap-times 0 --swap-to disk:/tmp");
  EXPECT_NE(no_swap.status, 0);
  EXPECT_THAT(no_swap.output, ::testing::HasSubstr("--swap-to disk:/tmp needs --swap-times N > 0"));
  EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
}

}  // namespace
}  // namespace stowage::testing
