// `stowage bench activation --peer`: PyTorch's checkpoint_sequential figures beside
// stowage's, from a real (tiny) run with the torch wheel's Python; without that Python,
// one line and a failure. No figure is judged here: benchmarks are not timed tests.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

namespace stowage::testing {
namespace {

// Small, yet each activation spans pages, so that every peak rises above the start.
const char* const kTiny = " bench activation --blocks 4 --width 64 --batch 512 --repetitions 1";

TEST(BenchActivationPeer, WithoutTheWheelsPythonSaysSoInOneLineAndFails) {
  if (!peer_python().empty()) GTEST_SKIP() << "this build has the torch wheel's Python";
  const auto result = run_command(stowage_binary() + kTiny + " --peer --json");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_NE(result.output.find("--peer"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find('{'), std::string::npos) << "no figures without the peer: " << result.output;
}

TEST(BenchActivationPeer, JsonHasEveryFigureOfBothSides) {
  if (peer_python().empty()) GTEST_SKIP() << "built without the torch wheel's Python";
  const auto result = run_command(stowage_binary() + kTiny + " --peer --json");
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  for (const char* key : {"plain_step_s", "plain_peak_bytes", "plain_compared_peak_bytes", "pytorch_plain_step_s",
                          "pytorch_plain_peak_bytes", "plain_step_over_pytorch", "plain_peak_over_pytorch"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << figures.dump();
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(figures["peak_measure"], "rss_high_water_above_step_start");
  EXPECT_EQ(figures["pytorch_version"].get<std::string>().substr(0, 2), "2.");
  EXPECT_GE(figures["threads"].get<int>(), 1);
  ASSERT_TRUE(figures["pytorch_target_met"].is_boolean()) << figures.dump();

  // 4 blocks: 2 and 4 segments by default (round(sqrt(4)) is 2).
  const nlohmann::json& runs = figures["runs"];
  ASSERT_EQ(runs.size(), 2u) << figures.dump();
  for (const nlohmann::json& run : runs) {
    for (const char* key : {"step_s", "peak_bytes", "compared_peak_bytes", "pytorch_step_s", "pytorch_peak_bytes",
                            "pytorch_nonreentrant_step_s", "pytorch_nonreentrant_peak_bytes", "step_over_pytorch",
                            "step_over_pytorch_nonreentrant", "peak_over_pytorch", "peak_over_pytorch_nonreentrant"}) {
      ASSERT_TRUE(run.contains(key)) << key << " missing from " << run.dump();
      EXPECT_GT(run[key].get<double>(), 0) << key << " in " << run.dump();
    }
    ASSERT_TRUE(run["pytorch_target_met"].is_boolean()) << run.dump();
  }
}

TEST(BenchActivationPeer, TextHasThePeersColumns) {
  if (peer_python().empty()) GTEST_SKIP() << "built without the torch wheel's Python";
  const auto result = run_command(stowage_binary() + kTiny + " --peer --segments 2");
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("against PyTorch 2."), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("pt-nr step"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("target: checkpointing step and peak at most PyTorch's"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace stowage::testing
