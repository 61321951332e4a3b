// `stowage bench`, which runs stowage-bench; `bench dcp`, `bench grad-sync` and `bench activation --train-model`:
// the JSON objects their issues specify, from real (small) runs; no figure is judged here, benchmarks are not timed
// tests.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

#include <unistd.h>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

// `stowage bench` runs stowage-bench beside it with the same arguments, and says which
// program it looked for when there is none.
TEST(BenchProgram, StowageBenchRunsTheProgramBesideItAndNamesItWhenMissing) {
  const auto help = run_command(stowage_binary() + " bench --help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_NE(help.output.find("Usage: stowage bench"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("capacity"), std::string::npos) << help.output;
  const auto refused = run_command(stowage_binary() + " bench swap --params 0");
  EXPECT_EQ(refused.status, 2) << refused.output;
  const fs::path alone = fs::temp_directory_path() / ("stowage-alone-" + std::to_string(getpid()));
  fs::create_directories(alone);
  fs::copy_file(stowage_binary(), alone / "stowage");
  const auto missing = run_command((alone / "stowage").string() + " bench dcp");
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find((alone / "stowage-bench").string()), std::string::npos) << missing.output;
  fs::remove_all(alone);
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

// Issue 40: the memory tier against storage on 2 "nodes" of one rank: every figure, each
// restore from the tier it names (the benchmark fails otherwise), storage read cold, and
// nothing left behind in either directory.
TEST(BenchMemoryTier, JsonHasEveryFigureAndBothDirectoriesAreEmptied) {
  const fs::path dir = fs::temp_directory_path() / ("stowage-bench-tier-test-" + std::to_string(getpid()));
  const fs::path memory = dir / "memory";
  const fs::path storage = dir / "storage";
  fs::create_directories(memory);
  fs::create_directories(storage);
  const auto result = run_command(stowage_binary() +
                                  " bench memory-tier --nproc 2 --size-mib 2 --tensors 2 --rounds 1 --memory-every 1 5 "
                                  "--storage-every 20 --json --memory-dir " +
                                  memory.string() + " --storage-dir " + storage.string());
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  for (const char* key :
       {"memory_save_s", "memory_replicate_s", "memory_replicated_s", "memory_save_gbps", "memory_replicated_gbps",
        "replicated_over_storage_save", "storage_block_s", "storage_commit_s", "storage_save_gbps",
        "memory_over_storage_save", "restore_memory_s", "restore_replica_s", "restore_storage_cold_s",
        "storage_over_memory_restore", "storage_over_replica_restore"}) {
    ASSERT_TRUE(figures.contains(key)) << key << " missing from " << last;
    EXPECT_GT(figures[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(figures["ranks"], 2);
  EXPECT_EQ(figures["ranks_per_node"], 1);
  EXPECT_EQ(figures["bytes_per_rank"].get<int64_t>(), int64_t(2) << 20);
  // The replicas are committed after the own copies, and the replication is part of that.
  EXPECT_LT(figures["memory_save_s"].get<double>(), figures["memory_replicated_s"].get<double>());
  EXPECT_LE(figures["memory_replicate_s"].get<double>(), figures["memory_replicated_s"].get<double>());
  // Dropped from the page cache before the cold restore (a tmpfs keeps its pages).
  if (run_command("stat -f -c %T " + storage.string()).output != "tmpfs\n") {
    EXPECT_LT(figures["storage_resident_fraction"].get<double>(), 0.5) << last;
  }
  // Two steps kept, own and replica, of 2 ranks: 8 checkpoints of 2 MiB and their metadata,
  // and at most one more a directory (a dropped one's pages kept to write over: keep_last
  // + 1, memory_tier_pages.h), 12 in all.
  EXPECT_GE(figures["memory_host_bytes"].get<int64_t>(), int64_t(16) << 20);
  EXPECT_LT(figures["memory_host_bytes"].get<int64_t>(), int64_t(25) << 20);
  EXPECT_EQ(figures["storage_mean_steps_lost"].get<double>(), 9.5);
  ASSERT_EQ(figures["steps_lost"].size(), 2u);
  EXPECT_EQ(figures["steps_lost"][0]["mean_steps_lost"].get<double>(), 0);
  EXPECT_EQ(figures["steps_lost"][1]["mean_steps_lost"].get<double>(), 2);
  EXPECT_TRUE(fs::is_empty(memory)) << "the benchmark left files in " << memory;
  EXPECT_TRUE(fs::is_empty(storage)) << "the benchmark left files in " << storage;
  fs::remove_all(dir);
  EXPECT_NE(run_command(stowage_binary() + " bench memory-tier --nproc 2 --nproc-per-node 2").status, 0)
      << "one node has no peer to replicate to";
}

// The ZeRO rows: copies hold the gradients twice, views once, ZeRO-2 this rank's share;
// the optimizer state is the same share in each.
TEST(BenchGradSync, ZeroRowsGiveEachModesMemoryPerRank) {
  const auto result = run_command(stowage_binary() +
                                  " bench grad-sync --zero --nproc 2 --train-width 32 --train-layers 2 "
                                  "--train-steps 3 --rounds 1 --json");
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  ASSERT_EQ(figures["rows"].size(), 3u) << last;
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : figures["rows"]) rows[row["mode"].get<std::string>()] = row;
  const auto grads = [&](const char* mode) { return rows.at(mode)["gradient_bytes"].get<int64_t>(); };
  const auto parameter_bytes = figures["parameter_bytes"].get<int64_t>();
  EXPECT_EQ(grads("zero1-views"), parameter_bytes) << last;
  EXPECT_EQ(grads("zero1-copies"), 2 * parameter_bytes) << last;
  EXPECT_GT(grads("zero2"), 0) << last;
  EXPECT_LT(grads("zero2"), parameter_bytes) << last;
  for (const char* mode : {"zero1-copies", "zero1-views", "zero2"}) {
    EXPECT_EQ(rows.at(mode)["optimizer_bytes"], rows.at("zero2")["optimizer_bytes"]) << mode;
    EXPECT_GT(rows.at(mode)["tokens_per_s"].get<double>(), 0) << mode;
    EXPECT_GT(rows.at(mode)["peak_step_bytes"].get<int64_t>(), grads(mode)) << mode;
  }
  EXPECT_LE(figures["zero2_gradients_vs_limit"].get<double>(), 1) << last;
}

// The train model under each way of checkpointing it: every mode's row, the budgets'
// plans within their budgets, and whole blocks at one block a segment below none.
TEST(BenchActivationTrain, RowsGiveEachModesPeakAndTheBudgetsPlans) {
  const auto result = run_command(stowage_binary() +
                                  " bench activation --train-model --train-layers 2 --train-width 32 --seq-lens 16 "
                                  "--train-steps 3 --train-rounds 1 --json");
  ASSERT_EQ(result.status, 0) << result.output;
  const std::string last = last_json_line(result.output);
  const nlohmann::json figures = nlohmann::json::parse(last);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : figures["rows"]) rows[row["mode"].get<std::string>()] = row;
  // none, sqrt(n) and n segments (1 and 2 of 2 blocks), attention core, MLP, 3 budgets.
  ASSERT_EQ(rows.size(), 8u) << last;
  const auto peak = [&](const std::string& mode) { return rows.at(mode)["peak_activation_bytes"].get<int64_t>(); };
  EXPECT_LT(peak("whole, 2 segments"), peak("none")) << last;
  int budgets = 0;
  for (const auto& [mode, row] : rows) {
    EXPECT_GT(row["step_s"].get<double>(), 0) << mode;
    if (row["budget_bytes"].get<int64_t>() == 0) continue;
    ++budgets;
    EXPECT_LE(peak(mode), row["budget_bytes"].get<int64_t>()) << mode;
    EXPECT_FALSE(row["plan"].get<std::string>().empty()) << mode;
  }
  EXPECT_EQ(budgets, 3) << last;
  EXPECT_FALSE(figures["goals"].empty()) << last;
}

}  // namespace
}  // namespace stowage::testing
