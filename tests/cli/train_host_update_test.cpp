// `stowage train --optimizer-update host [--offload-fraction F]`: the flags' checks, and on
// the simulated device a run resumed from its checkpoint ends as the uninterrupted run.
// (tests/cli/train_preempt_test.cpp preempts such runs with SIGTERM on the CPU.)

#include "cli/train_util.h"

#include <stowage/build_info.h>

#include <gmock/gmock.h>

namespace stowage::testing {
namespace {

using ::testing::HasSubstr;

TEST(TrainHostUpdate, BadOptionsAreNamed) {
  RunDir dir;
  const auto expect_refused = [&dir](const std::string& args, const std::string& message) {
    const auto run = train(dir, "--steps 1 " + args);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_THAT(run.output, HasSubstr(message)) << args;
  };
  expect_refused("--optimizer-update host --offload-fraction 1.5", "1.5 is not in [0, 1]");
  expect_refused("--optimizer-update gpu", "--optimizer-update");
  // The swap's own refusals, as the library words them.
  expect_refused("--offload-fraction 0.5",
                 "offload_fraction (0.5) splits the update between device and host: it needs update_on_host(true)");
  expect_refused("--optimizer-update host --swap-to disk:/tmp",
                 "update_on_host updates the states in host memory; the disk tier (swap_dir '/tmp') is not supported");
  expect_refused("--optimizer-update host --offload-fraction 0.5 --swap-times 0", "pass --swap-times N > 0 with it");
  EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
}

// Recorded in run.json: a resume that changes it is refused as a change of the model is.
TEST(TrainHostUpdate, AResumeThatMovesTheUpdateIsRefusedUnlessAllowed) {
  RunDir dir;
  ASSERT_EQ(train(dir, "--steps 2 --ckpt-every 2").status, 0);
  const auto moved = train(dir, "--steps 4 --ckpt-every 2 --resume --optimizer-update host");
  EXPECT_NE(moved.status, 0);
  EXPECT_THAT(moved.output, HasSubstr("--optimizer-update: device then, host now"));
  const auto allowed = train(dir, "--steps 4 --ckpt-every 2 --resume --optimizer-update host --allow-config-change");
  EXPECT_EQ(allowed.status, 0) << allowed.output;
}

TEST(TrainHostUpdate, ResumingOnTheSimulatedDeviceEndsAsTheUninterruptedRun) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  for (const std::string& update : {" --optimizer-update host", " --optimizer-update host --offload-fraction 0.5"}) {
    RunDir whole, halves;
    const std::string on_sim = " --device sim" + update;
    ASSERT_EQ(train(whole, "--steps 4 --ckpt-every 2" + on_sim).status, 0);
    ASSERT_EQ(train(halves, "--steps 2 --ckpt-every 2" + on_sim).status, 0);
    const auto resumed = train(halves, "--steps 4 --ckpt-every 2 --resume" + on_sim);
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    EXPECT_EQ(fingerprint(step_dir(whole, 4)), fingerprint(step_dir(halves, 4))) << update;
  }
}

// On a device the host's share of the gradients leaves the device during backward: the
// only gradients left there are those of the parameters updated on the device, the ones
// below min_numel (whose two states stay there too) or, half offloaded, the other half.
TEST(TrainHostUpdate, TheHostsGradientsLeaveTheDevice) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  RunDir all, half;
  ASSERT_EQ(train(all, "--steps 2 --device sim --optimizer-update host").status, 0);
  ASSERT_EQ(train(half, "--steps 2 --device sim --optimizer-update host --offload-fraction 0.5").status, 0);
  const json all_step = last_step_record(all);
  EXPECT_EQ(all_step["gradient_bytes"].get<int64_t>() * 2, all_step["optimizer_resident_bytes"].get<int64_t>())
      << all_step.dump();
  EXPECT_GT(last_step_record(half)["gradient_bytes"].get<int64_t>(), 4 * all_step["gradient_bytes"].get<int64_t>())
      << last_step_record(half).dump();
}

}  // namespace
}  // namespace stowage::testing
