// The progress line of `stowage train` fits the terminal: as a unit for several widths,
// and in real runs under a pseudo-terminal (script(1)) of a given width.
#include "cli/train_util.h"

#include "train_progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace stowage::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

train::StepRecord a_step() {
  train::StepRecord r;
  r.step = 1234;
  r.total_steps = 100000;
  r.loss = 2.3456;
  r.tokens_per_s = 123456;
  r.step_s = 0.0421;
  r.peak_activation_bytes = int64_t(3) << 30;
  r.peak_step_bytes = int64_t(4) << 30;
  r.optimizer_resident_bytes = int64_t(5) << 20;
  r.gradient_bytes = int64_t(6) << 20;
  r.checkpoint_host_bytes = int64_t(700) << 20;
  r.optimizer_host_bytes = int64_t(800) << 20;
  return r;
}

// The three tiers' newest saves: storage at 1200, memory and its replica at 1230.
train::CheckpointTiers some_tiers() {
  train::CheckpointTiers tiers;
  dcp::SaveReport storage;
  storage.step = 1200;
  storage.committed = true;
  storage.bytes = 1230000000;
  storage.blocked_s = 0.012;
  storage.commit_s = 1.0;
  tiers.record(storage);
  dcp::MemorySaveReport memory;
  memory.step = 1230;
  memory.save_s = 0.003;
  tiers.record(memory);
  dcp::ReplicationReport replica;
  replica.step = 1230;
  replica.replicate_s = 0.051;
  tiers.record(replica);
  return tiers;
}

TEST(ProgressLine, AWideTerminalShowsEveryField) {
  const std::string line = fit_progress_line(progress_fields(a_step(), some_tiers()), 400);
  for (const char* field : {"1234/100000", "[", "loss 2.346", "123456 tok/s", "42 ms", "act 3.0 GiB", "optim 5.0 MiB",
                            "grads 6.0 MiB", "peak 4.0 GiB", "host ckpt 700.0 MiB + swap 800.0 MiB",
                            "ckpt@1200 staged 12 ms, committed 1.23 GB/s", "mem@1230 3 ms", "replica@1230 51 ms"}) {
    EXPECT_THAT(line, HasSubstr(field));
  }
}

// Each tier shows its newest save that succeeded; one node has no replica.
TEST(ProgressLine, EachTierShowsItsNewestSave) {
  train::CheckpointTiers tiers = some_tiers();
  dcp::MemorySaveReport failed;
  failed.step = 1240;
  failed.error = "rank 1: No space left on device";
  tiers.record(failed);
  dcp::SaveReport uncommitted;
  uncommitted.step = 1250;
  uncommitted.error = "EIO";
  tiers.record(uncommitted);
  std::string line = fit_progress_line(progress_fields(a_step(), tiers), 400);
  EXPECT_THAT(line, HasSubstr("ckpt@1200 "));
  EXPECT_THAT(line, HasSubstr("mem@1230 "));
  EXPECT_THAT(line, HasSubstr("replica@1230 "));
  dcp::MemorySaveReport one_node;
  one_node.step = 1260;
  one_node.save_s = 0.004;
  tiers.record(one_node);
  line = fit_progress_line(progress_fields(a_step(), tiers), 400);
  EXPECT_THAT(line, HasSubstr("mem@1260 4 ms"));
  EXPECT_THAT(line, HasSubstr("replica@1230 "));  // the newest replica is still the older step's
  EXPECT_THAT(fit_progress_line(progress_fields(a_step(), train::CheckpointTiers()), 400), Not(HasSubstr("@")));
}

TEST(ProgressLine, NarrowerTerminalsDropTheLeastImportantFieldsFirst) {
  const std::vector<ProgressField> fields = progress_fields(a_step(), some_tiers());
  const size_t full = fit_progress_line(fields, 400).size();
  // In the order they go: each width keeps every field more important than the first
  // one dropped.
  const std::vector<std::string> by_importance = {"1234/100000", "loss",   "tok/s",  "[",     "ckpt@",    "42 ms",
                                                  "act ",        "optim ", "grads ", "peak ", "host ckpt"};
  size_t previous_shown = by_importance.size();
  for (int columns = static_cast<int>(full); columns >= 0; --columns) {
    SCOPED_TRACE("columns " + std::to_string(columns));
    const std::string line = fit_progress_line(fields, columns);
    ASSERT_LE(line.size(), static_cast<size_t>(columns));
    size_t shown = 0;
    while (shown < by_importance.size() && line.find(by_importance[shown]) != std::string::npos) ++shown;
    for (size_t i = shown; i < by_importance.size(); ++i) {
      EXPECT_THAT(line, Not(HasSubstr(by_importance[i]))) << "shown although a more important field is not";
    }
    EXPECT_LE(shown, previous_shown);  // a narrower line never shows more
    previous_shown = shown;
  }
  EXPECT_THAT(fit_progress_line(fields, 80), HasSubstr("loss 2.346"));
  EXPECT_THAT(fit_progress_line(fields, 80), Not(HasSubstr("staging")));
  EXPECT_EQ(fit_progress_line(fields, 13), "  1234/100000");  // the step count, aligned for later steps
  EXPECT_EQ(fit_progress_line(fields, 4), "  12");            // cut when nothing else fits
}

// A run under a pseudo-terminal `columns` wide: every redraw of the progress line fits.
std::vector<std::string> redraws_at_width(int columns) {
  testing::RunDir dir;
  const std::string command = "stty cols " + std::to_string(columns) + " rows 24; exec " + testing::stowage_binary() +
                              " train --run-dir " + dir.str() + testing::kSmall + " --steps 12 --ckpt-every 6";
  const testing::CommandResult result = testing::run_command("script -qec '" + command + "' /dev/null");
  EXPECT_EQ(result.status, 0) << result.output;
  std::vector<std::string> redraws;
  const std::string redraw = "\r\033[2K";
  for (size_t at = result.output.find(redraw); at != std::string::npos;) {
    const size_t start = at + redraw.size();
    const size_t next = result.output.find_first_of("\r\n", start);
    redraws.push_back(result.output.substr(start, next - start));
    at = result.output.find(redraw, start);
  }
  return redraws;
}

TEST(ProgressLine, EveryRedrawFitsARealTerminal) {
  for (const int columns : {160, 100, 60}) {
    SCOPED_TRACE("columns " + std::to_string(columns));
    const std::vector<std::string> redraws = redraws_at_width(columns);
    ASSERT_FALSE(redraws.empty());
    for (const std::string& line : redraws) {
      if (line.find("/12") == std::string::npos) continue;  // a message printed above the bar
      EXPECT_LT(line.size(), static_cast<size_t>(columns)) << line;
      EXPECT_THAT(line, HasSubstr("loss"));
    }
  }
}

// Two "nodes" of one rank each: every step's record in metrics.jsonl names each tier's
// newest save (memory every 2, storage every 4), and the log lines show the memory tier's.
TEST(ProgressLine, ARunShowsTheNewestSaveOfEachTier) {
  testing::RunDir dir, memory;
  std::string small = testing::kSmall;
  small.replace(small.find("--log-every 1000"), std::string("--log-every 1000").size(), "--log-every 1");
  const testing::CommandResult result =
      testing::run_command(testing::stowage_binary() + " train --run-dir " + dir.str() + small +
                           " --nproc 2 --nproc-per-node 1 --steps 6 --ckpt-every 4 --memory-ckpt-every 2 "
                           "--memory-ckpt-dir " +
                           memory.str());
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("mem@6 "));
  EXPECT_THAT(result.output, HasSubstr("replica@4 "));
  std::ifstream metrics(dir.path / "metrics.jsonl");
  std::map<int64_t, nlohmann::json> tiers_at;  // by step
  std::vector<int64_t> replicated;             // the memory_replication records' steps
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record["event"] == "step") tiers_at[record["step"].get<int64_t>()] = record["tiers"];
    if (record["event"] == "memory_replication") replicated.push_back(record["step"].get<int64_t>());
  }
  // Each replication is reported by the next save, the last one at the run's end.
  EXPECT_EQ(replicated, (std::vector<int64_t>{2, 4, 6}));
  ASSERT_EQ(tiers_at.size(), 6u);
  EXPECT_EQ(tiers_at[1], nlohmann::json::object()) << "no tier has a save before step 1's";
  for (const auto& [step, tiers] : tiers_at) {
    SCOPED_TRACE("step " + std::to_string(step));
    // A step's record follows its memory save, whose copy is committed when it returns:
    // steps 2 and 3 name step 2. Its replica is known from the next save on.
    if (step >= 2) EXPECT_EQ(tiers["memory"]["step"], step / 2 * 2);
    EXPECT_EQ(tiers.contains("replica"), step >= 4);
    if (step >= 4) {
      EXPECT_EQ(tiers["replica"]["step"], step / 2 * 2 - 2);
      EXPECT_GT(tiers["replica"]["ms"].get<double>(), 0);
    }
    // The storage's save commits in the background: it shows from the step it was seen.
    if (tiers.contains("storage")) {
      EXPECT_GT(step, 4);
      EXPECT_EQ(tiers["storage"]["step"], 4);
    }
  }
}

}  // namespace
}  // namespace stowage::cli
