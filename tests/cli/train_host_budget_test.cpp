// `stowage train --ckpt-host-budget`: checkpointing within a host-memory budget. Staging
// proceeds in waves that fit, every step's measured host bytes (staging buffers and the
// memory tier's files) stay within the budget, the checkpoints are those of a run
// without a budget, and a budget too small is refused before the first step.
#include "cli/train_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace stowage::testing {
namespace {

// metrics.jsonl's records of `event`.
std::vector<json> records_of(const RunDir& dir, const std::string& event) {
  std::vector<json> records;
  std::ifstream file(dir.path / "metrics.jsonl");
  for (std::string line; std::getline(file, line);) {
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("event", "") == event) records.push_back(record);
  }
  return records;
}

// How many waves wrote the checkpoint in `checkpoint` (its data files' "-w<N>-").
size_t waves_of(const std::string& checkpoint) {
  std::set<std::string> waves;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.find("-w");
    if (name.rfind("data-", 0) == 0 && at != std::string::npos) waves.insert(name.substr(at, name.find('-', at + 1)));
  }
  return waves.size();
}

constexpr int64_t kQuarterOfTheState = 400 * 1024;  // kSmall's state is ~1.5 MB

TEST(TrainHostBudget, ABudgetBelowTheStateSavesInWavesWithinItAndTheSameCheckpoints) {
  RunDir budgeted, plain;
  const auto a = train(budgeted, "--steps 4 --ckpt-every 2 --ckpt-host-budget 400KiB");
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_EQ(train(plain, "--steps 4 --ckpt-every 2").status, 0);
  EXPECT_GE(waves_of(step_dir(budgeted, 4)), 2u);
  expect_same_checkpoint(step_dir(plain, 4), step_dir(budgeted, 4));
  int64_t highest = 0;
  for (const json& step : records_of(budgeted, "step")) {
    EXPECT_LE(step["checkpoint_host_peak_bytes"].get<int64_t>(), kQuarterOfTheState) << step.dump();
    highest = std::max(highest, step["checkpoint_host_peak_bytes"].get<int64_t>());
  }
  EXPECT_GT(highest, 0) << "the staging buffers were measured";
  const std::vector<json> saves = records_of(budgeted, "checkpoint");
  ASSERT_EQ(saves.size(), 2u);
  for (const json& save : saves) {
    EXPECT_GT(save["host_peak_bytes"].get<int64_t>(), 0) << save.dump();
    EXPECT_LE(save["host_peak_bytes"].get<int64_t>(), kQuarterOfTheState) << save.dump();
  }
  const std::vector<json> end = records_of(budgeted, "end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0]["checkpoint_host_budget_bytes"], kQuarterOfTheState);
  EXPECT_LE(end[0]["checkpoint_host_peak_bytes"].get<int64_t>(), kQuarterOfTheState);
}

TEST(TrainHostBudget, AnImpossibleBudgetIsRefusedBeforeTheFirstStepNamingTheSmallestThatFits) {
  RunDir dir;
  const auto result = train(dir, "--steps 4 --ckpt-every 2 --ckpt-host-budget 16KiB");
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("checkpoint_host_budget_bytes of 16384 bytes (16.0 KiB) is too small; the smallest "
                               "that fits is 65536 bytes (64.0 KiB)"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(dir.path / "metrics.jsonl")) << "nothing was trained";
}

// The memory tier's checkpoints count: a budget that staging alone would fit is refused
// with the tier on, and a run with one that fits both measures the tier's files.
TEST(TrainHostBudget, TheMemoryTiersCheckpointsCountAgainstTheBudget) {
  RunDir refused, fitting;
  const std::string tier = " --memory-ckpt-every 1 --memory-ckpt-dir ";
  const auto no = train(refused, "--steps 4 --ckpt-every 2 --ckpt-host-budget 1MiB" + tier + refused.str() + "/mem");
  EXPECT_NE(no.status, 0);
  EXPECT_NE(no.output.find("for the memory tier's checkpoints"), std::string::npos) << no.output;
  const auto yes = train(fitting, "--steps 4 --ckpt-every 2 --ckpt-host-budget 8MiB" + tier + fitting.str() + "/mem");
  ASSERT_EQ(yes.status, 0) << yes.output;
  const int64_t checkpoint_bytes = records_of(fitting, "checkpoint").at(0)["bytes"].get<int64_t>();
  int64_t highest = 0;
  for (const json& step : records_of(fitting, "step")) {
    EXPECT_LE(step["checkpoint_host_peak_bytes"].get<int64_t>(), int64_t(8) << 20) << step.dump();
    highest = std::max(highest, step["checkpoint_host_peak_bytes"].get<int64_t>());
  }
  // From the second memory save on, the tier holds two checkpoints (keep_last 2).
  EXPECT_GE(highest, 2 * checkpoint_bytes);
}

}  // namespace
}  // namespace stowage::testing
