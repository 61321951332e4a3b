// `stowage bench dcp` and `bench grad-sync`: the JSON objects their issues specify, from
// real (small) runs; no figure is judged here, benchmarks are not timed tests.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include <unistd.h>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

// The benchmark's JSON object: its last line that starts one (LibTorch may log before it).
std::string last_json_line(const std::string& output) {
  std::istringstream lines(output);
  std::string last;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.front() == '{') last = line;
  }
  return last;
}

TEST(BenchDcp, JsonHasEveryFigureAndTheScratchSpaceIsRemoved) {
  const fs::path dir = fs::temp_directory_path() / ("stowage-bench-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto result = run_command(stowage_binary() + " bench dcp --size-mib 4 --nproc 2 --json --dir " + dir.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  for (const char* key : {"memcpy_gbps", "stage_cached_gbps", "stage_uncached_gbps", "save_gbps",
                          "save_one_thread_gbps", "raw_write_gbps", "torch_save_gbps", "load_gbps", "torch_load_gbps",
                          "async_block_s", "stage_s", "aggregate_save_gbps"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << last;
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(figures["ranks"].get<int>(), 2);
  EXPECT_EQ(figures["bytes"].get<int64_t>(), int64_t(4) << 20);
  EXPECT_TRUE(fs::is_empty(dir)) << "the benchmark left files in " << dir;
  fs::remove_all(dir);
}

// The device staging figures of the GPU check (scripts/device_check.sh), here from the CPU.
TEST(BenchDcp, DeviceStagingJsonHasEveryFigure) {
  const fs::path dir = fs::temp_directory_path() / ("stowage-bench-device-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto result =
      run_command(stowage_binary() + " bench dcp --device cpu --size-mib 4 --json --dir " + dir.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  EXPECT_EQ(figures["device"], "cpu");
  for (const char* key : {"copy_limit_gbps", "stage_gbps", "stage_over_limit", "async_block_s", "async_complete_s"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << last;
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "the benchmark left files in " << dir;
  fs::remove_all(dir);
}

TEST(BenchGradSync, JsonHasEveryFigureOfTwoRanks) {
  const auto result = run_command(stowage_binary() +
                                  " bench grad-sync --nproc 2 --blocks 4 --width 64 --batch 8 --steps 2 "
                                  "--bucket-cap-mb 0.02 --json");
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  EXPECT_EQ(figures["ranks"].get<int>(), 2);
  EXPECT_EQ(figures["gradient_bytes"].get<int64_t>(), 4 * (64 * 64 + 64) * 4);
  EXPECT_EQ(figures["buckets"].get<int64_t>(), 4);  // 4 Linear(64)s of 16.25 KiB, in buckets of up to 20 KiB
  for (const char* key : {"compute_step_s", "after_backward_step_s", "overlap_step_s", "overlap_speedup"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << last;
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  EXPECT_TRUE(figures.contains("hidden_fraction")) << last;
}

}  // namespace
}  // namespace stowage::testing
