// `stowage bench dcp --peer`: PyTorch DCP's figures beside stowage's, from a real (small)
// run with the torch wheel's Python; without that Python, one line and a failure. No
// figure is judged here: benchmarks are not timed tests.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include <unistd.h>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

TEST(BenchDcpPeer, WithoutTheWheelsPythonSaysSoInOneLineAndFails) {
  if (!peer_python().empty()) GTEST_SKIP() << "this build has the torch wheel's Python";
  const auto result = run_command(stowage_binary() + " bench dcp --peer --size-mib 1");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_NE(result.output.find("--peer"), std::string::npos) << result.output;
}

TEST(BenchDcpPeer, JsonHasEveryFigureOfBothSidesAndTheScratchSpaceIsRemoved) {
  if (peer_python().empty()) GTEST_SKIP() << "built without the torch wheel's Python";
  const fs::path dir = fs::temp_directory_path() / ("stowage-bench-dcp-peer-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  // The peer checks every value its dcp.load read back from the checkpoint its dcp.save
  // wrote, and fails the run otherwise.
  const auto result = run_command(stowage_binary() + " bench dcp --peer --size-mib 4 --json --dir " + dir.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const nlohmann::json figures = json_in_output(result.output);
  ASSERT_TRUE(figures.is_object()) << result.output;
  for (const char* key :
       {"pytorch_dcp_save_gbps", "pytorch_dcp_save_two_threads_gbps", "pytorch_dcp_async_block_s",
        "pytorch_dcp_async_complete_s", "pytorch_dcp_load_gbps", "save_gbps", "save_one_thread_gbps", "load_gbps",
        "async_block_default_stager_s", "async_complete_default_stager_s", "save_one_thread_over_pytorch_dcp",
        "save_two_threads_over_pytorch_dcp", "load_over_pytorch_dcp", "async_block_over_pytorch_dcp"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << figures.dump();
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  // A save may find all the memory it needs already resident: its rise can be 0.
  for (const char* key : {"pytorch_dcp_peak_host_bytes", "save_peak_host_bytes", "peak_host_over_pytorch_dcp"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << figures.dump();
    EXPECT_GE(figures[key].get<double>(), 0) << key;
  }
  for (const char* key :
       {"save_one_thread_over_pytorch_dcp_met", "save_two_threads_over_pytorch_dcp_met", "load_over_pytorch_dcp_met",
        "async_block_over_pytorch_dcp_met", "peak_host_over_pytorch_dcp_met"}) {
    ASSERT_TRUE(figures.contains(key) && figures[key].is_boolean()) << key << " in " << figures.dump();
  }
  EXPECT_EQ(figures["peak_host_measure"], "rss_high_water_above_start");
  EXPECT_EQ(figures["pytorch_version"].get<std::string>().substr(0, 2), "2.");
  EXPECT_TRUE(fs::is_empty(dir)) << "the benchmark left files in " << dir;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace stowage::testing
