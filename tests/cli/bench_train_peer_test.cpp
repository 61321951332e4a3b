// `stowage bench train`: stowage's tokens per second alone, and with --peer beside the
// same training in PyTorch, from real (tiny) runs; without the torch wheel's Python,
// --peer says so in one line and fails. No figure is judged here.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
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

TEST(BenchTrainPeer, WithoutTheWheelsPythonSaysSoInOneLineAndFails) {
  if (!peer_python().empty()) GTEST_SKIP() << "this build has the torch wheel's Python";
  const auto result = run_command(stowage_binary() + " bench train --peer --steps 2");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_NE(result.output.find("--peer"), std::string::npos) << result.output;
}

TEST(BenchTrain, WithoutPeerMeasuresStowageAlone) {
  const TrainBenchDir dir;
  const auto result = run_command(stowage_binary() + " bench train --steps 4 --ckpt-every 2 --rounds 1 --json --dir " +
                                  dir.path.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  EXPECT_GT(figures["stowage_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(figures["tokens"].get<int64_t>(), 4 * 16 * 64);
  EXPECT_FALSE(figures.contains("pytorch_tokens_per_s")) << figures.dump();
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the benchmark left files in " << dir.path;
}

TEST(BenchTrainPeer, JsonHasBothSidesTrainingTheSameModelOnTheSameData) {
  if (peer_python().empty()) GTEST_SKIP() << "built without STOWAGE_PYTHON (the torch wheel's Python)";
  const TrainBenchDir dir;
  // The PyTorch script's checkpoints are checked for their .metadata by the benchmark.
  const auto result = run_command(stowage_binary() + " bench train --peer --steps 4 --ckpt-every 2 --rounds 1 --json " +
                                  "--dir " + dir.path.string());
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
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the benchmark left files in " << dir.path;
}

}  // namespace
}  // namespace stowage::testing
