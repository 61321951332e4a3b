// `stowage train --device sim` and `stowage bench capacity`: a model whose plain training
// exceeds the simulated device's capacity trains within it with stowage.
#include "cli/train_util.h"

#include <stowage/build_info.h>

#include <gmock/gmock.h>

namespace stowage::testing {
namespace {

using ::testing::HasSubstr;

// Activation-heavy: batch 16 x 64 tokens through 4 blocks of width 64. Plain training
// needs ~22 MiB of device memory, stowage's ~12 MiB (measured).
const std::string kActivationHeavy = " --layers 4 --width 64 --heads 2 --batch 16 --seq-len 64 --threads 1";

// `environment`: further variables for the run ("NAME=value ").
CommandResult train_on_sim(const RunDir& dir, const std::string& capacity, const std::string& args,
                           const std::string& environment = "") {
  return run_command(environment + "STOWAGE_SIM_CAPACITY=" + capacity + " " + stowage_binary() +
                     " train --device sim --run-dir " + dir.str() + kActivationHeavy + " --log-every 1000 " + args);
}

TEST(TrainOnSim, APlainRunPastTheCapacityFailsWithTheDevicesOutOfMemoryErrorAndStowagesFinishes) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  RunDir plain_dir;
  const auto plain = train_on_sim(plain_dir, "16MiB", "--steps 2 --swap-times 0 --recompute-segments 0");
  EXPECT_EQ(plain.status, 3) << plain.output;  // a device out of memory: stowage bench capacity reads it
  EXPECT_THAT(plain.output, HasSubstr("sim:0 is out of memory: tried to allocate "));
  EXPECT_THAT(plain.output, HasSubstr("the device holds 16777216 bytes (16.0 MiB)"));
  RunDir stowage_dir;
  const auto with_stowage = train_on_sim(stowage_dir, "16MiB", "--steps 2 --swap-times 4 --recompute-segments 4");
  EXPECT_EQ(with_stowage.status, 0) << with_stowage.output;
  EXPECT_THAT(with_stowage.output, HasSubstr("done: steps 1-2"));
  EXPECT_THAT(with_stowage.output, HasSubstr("on sim:0"));
}

TEST(TrainOnSim, ResumingOnTheDeviceEndsAsTheUninterruptedRun) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  RunDir whole;
  ASSERT_EQ(train_on_sim(whole, "64MiB", "--steps 4 --ckpt-every 2").status, 0);
  RunDir halves;
  ASSERT_EQ(train_on_sim(halves, "64MiB", "--steps 2 --ckpt-every 2").status, 0);
  const auto resumed = train_on_sim(halves, "64MiB", "--steps 4 --ckpt-every 2 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_EQ(fingerprint(whole.str() + "/checkpoints/step-00000004"),
            fingerprint(halves.str() + "/checkpoints/step-00000004"));
}

// Offloading the checkpoints' inputs to host memory, and checkpointing the attention core
// alone, train on the device bit-identically to keeping everything there.
TEST(TrainOnSim, OffloadedCheckpointInputsAndSelectiveRecomputeTrainAsThePlainRun) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  const std::string common = "--steps 3 --ckpt-every 3 --swap-times 0 ";
  RunDir plain, offloaded, selective;
  ASSERT_EQ(train_on_sim(plain, "64MiB", common + "--recompute-segments 0").status, 0);
  const auto with_offload =
      train_on_sim(offloaded, "64MiB", common + "--recompute-segments 4 --offload-checkpoint-inputs");
  ASSERT_EQ(with_offload.status, 0) << with_offload.output;
  EXPECT_THAT(with_offload.output, HasSubstr("activation checkpointing: 4 segments, inputs offloaded"));
  ASSERT_EQ(
      train_on_sim(selective, "64MiB",
                   common + "--recompute-segments 0 --selective-recompute attention-core --offload-checkpoint-inputs")
          .status,
      0);
  EXPECT_EQ(fingerprint(plain.str() + "/checkpoints/step-00000003"),
            fingerprint(offloaded.str() + "/checkpoints/step-00000003"));
  EXPECT_EQ(fingerprint(plain.str() + "/checkpoints/step-00000003"),
            fingerprint(selective.str() + "/checkpoints/step-00000003"));
}

// On a device without pinned host memory, offload copies the checkpoints' inputs to
// pageable memory, each copy done when it returns: it says so once, and trains as the
// plain run does.
TEST(TrainOnSim, WithoutPinnedMemoryOffloadSaysSoOnceAndTrainsAsThePlainRun) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  const std::string common = "--steps 3 --ckpt-every 3 --swap-times 0 ";
  RunDir plain, offloaded;
  ASSERT_EQ(train_on_sim(plain, "64MiB", common + "--recompute-segments 0").status, 0);
  const auto result = train_on_sim(offloaded, "64MiB", common + "--recompute-segments 4 --offload-checkpoint-inputs",
                                   "STOWAGE_SIM_PINNED_MEMORY=0 ");
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("activation checkpointing: 4 segments, inputs offloaded"));
  const std::string warning = "offload_inputs without pinned host memory for sim:0";
  const size_t first = result.output.find(warning);
  ASSERT_NE(first, std::string::npos) << result.output;
  EXPECT_EQ(result.output.find(warning, first + 1), std::string::npos) << "said more than once: " << result.output;
  EXPECT_EQ(fingerprint(plain.str() + "/checkpoints/step-00000003"),
            fingerprint(offloaded.str() + "/checkpoints/step-00000003"));
}

TEST(TrainOnSim, APinnedMemorySettingOtherThanOneOrZeroIsAnErrorNamingIt) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  RunDir dir;
  const auto result = train_on_sim(dir, "64MiB", "--steps 1", "STOWAGE_SIM_PINNED_MEMORY=maybe ");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("STOWAGE_SIM_PINNED_MEMORY='maybe' is neither 1 nor 0"));
  EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
}

// Data parallelism on a device without a collective library of its own: the gradients go
// over Gloo on host copies, as c10d offers such a device.
TEST(TrainOnSim, TwoRanksReduceTheirGradientsThroughHostCopies) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  RunDir dir;
  const auto result = train_on_sim(dir, "64MiB", "--steps 2 --nproc 2");
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("on sim:0, gradients reduced through c10d gloo (host copies)"));
  EXPECT_THAT(result.output, HasSubstr("done: steps 1-2"));
}

TEST(TrainOnSim, BadDevicesAndCapacitiesAreClearErrorsNamingTheValue) {
  const bool with_sim = build_info().with_sim;
  for (const auto& [capacity, device, message] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"64MiB", "sim:9", with_sim ? "there is no device sim:9" : "needs LibTorch 2.x"},
           {"64MiB", "sim:x", with_sim ? "--device 'sim:x': expected sim or sim:N" : "needs LibTorch 2.x"},
           {"0", "sim", with_sim ? "STOWAGE_SIM_CAPACITY='0' is not a capacity" : "needs LibTorch 2.x"},
           {"-3MiB", "sim", with_sim ? "STOWAGE_SIM_CAPACITY='-3MiB' is not a capacity" : "needs LibTorch 2.x"},
           {"lots", "sim", with_sim ? "STOWAGE_SIM_CAPACITY='lots' is not a capacity" : "needs LibTorch 2.x"}}) {
    SCOPED_TRACE(capacity + " " + device);
    RunDir dir;
    const auto result = run_command("STOWAGE_SIM_CAPACITY=" + capacity + " " + stowage_binary() +
                                    " train --steps 1 --device " + device + " --run-dir " + dir.str());
    EXPECT_NE(result.status, 0) << result.output;
    EXPECT_THAT(result.output, HasSubstr(message));
    EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
  }
}

TEST(BenchCapacity, FindsTheLargestModelOfEachWay) {
  if (!build_info().with_sim) GTEST_SKIP() << "the simulated device needs LibTorch 2.x";
  const json result = run_json("bench capacity --json --capacity 16mib --max-layers 4 --steps 1 --width 64 --batch 16");
  const json& row = result["capacities"][0];
  EXPECT_EQ(row["capacity"], "16mib");  // any spelling byte_size() reads
  // Plain training fits fewer blocks than the search's cap; stowage's reaches it.
  EXPECT_GE(row["plain_layers"].get<int64_t>(), 1) << row.dump();
  EXPECT_LT(row["plain_layers"].get<int64_t>(), 4) << row.dump();
  EXPECT_EQ(row["stowage_host_layers"], 4) << row.dump();
  EXPECT_EQ(row["stowage_disk_layers"], 4) << row.dump();
  EXPECT_EQ(row["stowage_host_update_layers"], 4) << row.dump();
  EXPECT_DOUBLE_EQ(row["stowage_host_over_plain"].get<double>(),
                   row["stowage_host_parameters"].get<double>() / row["plain_parameters"].get<double>());
  // At plain's largest model: the swap leaves the states on the host, the update on the
  // host the gradients too (at this size the activations' peak comes first, so no less),
  // and the checkpoints' inputs in host memory take less again.
  const json& device = result["device_bytes"];
  const auto per_parameter = [&device](const std::string& mode) {
    return device[mode + "_device_bytes_per_parameter"].get<double>();
  };
  EXPECT_EQ(device["layers"], row["plain_layers"]) << device.dump();
  EXPECT_LT(per_parameter("stowage_host"), per_parameter("plain")) << device.dump();
  EXPECT_LE(per_parameter("stowage_host_update"), per_parameter("stowage_host")) << device.dump();
  EXPECT_LT(per_parameter("stowage_host_update_offloaded_inputs"), per_parameter("stowage_host_update"))
      << device.dump();
}

}  // namespace
}  // namespace stowage::testing
