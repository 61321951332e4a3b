// `stowage bench train`: stowage's tokens per second and dip after a checkpoint alone,
// and with --peer beside the same training in PyTorch, on 1 and 2 ranks, from real
// (tiny) runs; without the torch wheel's Python, --peer says so in one line and fails.
// No figure is judged here: the dips are only checked to be there and finite.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <unistd.h>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

// A scratch directory of the test's own, removed at the end.
struct TrainBenchDir {
  fs::path path = fs::temp_directory_path() / ("stowage-bench-train-test-" + std::to_string(getpid()));
  TrainBenchDir() { fs::create_directories(path); }
  ~TrainBenchDir() { fs::remove_all(path); }
};

// The smallest schedule with a dip to measure: checkpoints at steps 8 and 16, windows of
// 2 steps, far steps 6 and 11-14 (the first 5 are warm-up).
// One thread per rank: two ranks of two threads would crawl on a busy two-core machine.
const std::string kDipRun = " --steps 16 --ckpt-every 8 --dip-window 2 --threads 1 --rounds 1 --json";

// The dip's figures of `side` ("stowage", "pytorch") are there and finite.
void expect_dip(const nlohmann::json& figures, const std::string& side) {
  for (const std::string& key : {"dip_mean", "dip_worst", "dip_baseline_step_s"}) {
    const std::string name = side + "_" + key;
    ASSERT_TRUE(figures.contains(name) && figures[name].is_number()) << name << " missing from " << figures.dump();
    EXPECT_TRUE(std::isfinite(figures[name].get<double>())) << name << ": " << figures[name];
  }
  EXPECT_GT(figures[side + "_dip_baseline_step_s"].get<double>(), 0) << figures.dump();
  EXPECT_GE(figures[side + "_dip_worst"].get<double>(), figures[side + "_dip_mean"].get<double>() - 1e-9)
      << figures.dump();
  EXPECT_GE(figures[side + "_dip_commit_lag_steps"].get<int64_t>(), 1) << figures.dump();
}

// The first checkpoint's change of step speed (issue 37), from kDipRun's one round: far
// step 6 before it, 11-14 after it, in the run with checkpoints and in the one without;
// the change is the ratio of the two after/before ratios, either way (never below 1).
void expect_first_checkpoint_change(const nlohmann::json& figures) {
  const nlohmann::json& saved = figures["stowage_after_over_before_first_checkpoint_rounds"];
  const nlohmann::json& unsaved = figures["no_checkpoint_after_over_before_rounds"];
  ASSERT_TRUE(saved.is_array() && saved.size() == 1 && unsaved.is_array() && unsaved.size() == 1) << figures.dump();
  const double x = saved[0].get<double>() / unsaved[0].get<double>();
  const double change = figures["stowage_first_checkpoint_change"].get<double>();
  EXPECT_NEAR(change, std::max(x, 1 / x), 1e-9) << figures.dump();
  EXPECT_GE(change, 1.0);
  EXPECT_EQ(figures["stowage_first_checkpoint_change_met"].get<bool>(),
            change <= figures["stowage_first_checkpoint_change_limit"].get<double>());
}

TEST(BenchTrainPeer, WithoutTheWheelsPythonSaysSoInOneLineAndFails) {
  if (!peer_python().empty()) GTEST_SKIP() << "this build has the torch wheel's Python";
  const auto result = run_command(stowage_binary() + " bench train --peer --steps 2");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_NE(result.output.find("--peer"), std::string::npos) << result.output;
}

TEST(BenchTrain, WithoutPeerMeasuresStowageAlone) {
  const TrainBenchDir dir;
  const auto result = run_command(stowage_binary() + " bench train" + kDipRun + " --dir " + dir.path.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  EXPECT_GT(figures["stowage_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(figures["tokens"].get<int64_t>(), 16 * 16 * 64);
  EXPECT_FALSE(figures.contains("pytorch_tokens_per_s")) << figures.dump();
  EXPECT_FALSE(figures.contains("pytorch_dip_mean")) << figures.dump();
  EXPECT_EQ(figures["dip_window"].get<int64_t>(), 2);
  EXPECT_EQ(figures["dip_window_steps"].get<int64_t>(), 2);
  EXPECT_EQ(figures["dip_far_steps"].get<int64_t>(), 5);
  expect_dip(figures, "stowage");
  ASSERT_TRUE(figures["dip_target_met"].is_boolean()) << figures.dump();
  expect_first_checkpoint_change(figures);
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the benchmark left files in " << dir.path;
}

TEST(BenchTrainPeer, JsonHasBothSidesTrainingTheSameModelOnTheSameData) {
  if (peer_python().empty()) GTEST_SKIP() << "built without the torch wheel's Python";
  const TrainBenchDir dir;
  // The PyTorch script's checkpoints are checked for their .metadata by the benchmark.
  const auto result = run_command(stowage_binary() + " bench train --peer" + kDipRun + " --dir " + dir.path.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  for (const char* key : {"stowage_tokens_per_s", "pytorch_tokens_per_s", "stowage_over_pytorch_tokens_per_s",
                          "stowage_seconds", "pytorch_seconds"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << figures.dump();
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  ASSERT_TRUE(figures["stowage_over_pytorch_tokens_per_s_met"].is_boolean()) << figures.dump();
  // The same initial weights and the same first batch: the same first loss (stowage
  // prints it to 3 decimals).
  EXPECT_NEAR(figures["stowage_first_loss"].get<double>(), figures["pytorch_first_loss"].get<double>(), 2e-3);
  expect_dip(figures, "stowage");
  expect_dip(figures, "pytorch");
  ASSERT_TRUE(figures["dip_target_met"].is_boolean()) << figures.dump();
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the benchmark left files in " << dir.path;
}

// Both sides on 2 ranks (stowage alone without the wheel's Python): the same model and
// data, so the same losses, and each side's dip from its rank 0's steps.
TEST(BenchTrainPeer, TwoRanksMeasureBothSidesDips) {
  const TrainBenchDir dir;
  const bool peer = !peer_python().empty();
  const auto result = run_command(stowage_binary() + " bench train --nproc 2" + (peer ? " --peer" : "") + kDipRun +
                                  " --dir " + dir.path.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  EXPECT_EQ(figures["nproc"].get<int>(), 2);
  expect_dip(figures, "stowage");
  if (peer) {
    expect_dip(figures, "pytorch");
    EXPECT_NEAR(figures["stowage_first_loss"].get<double>(), figures["pytorch_first_loss"].get<double>(), 2e-3);
    EXPECT_NEAR(figures["stowage_last_loss"].get<double>(), figures["pytorch_last_loss"].get<double>(), 2e-2);
  }
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the benchmark left files in " << dir.path;
}

}  // namespace
}  // namespace stowage::testing
