// metrics.jsonl written by train::MetricsFile and read back by parse_step_record and
// parse_run_summary: every field comes back as written, and a line that is no such
// record, or lacks a field, is refused by name.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/train/events.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace stowage::train {
namespace {

using dcp::testing::ScratchDir;

std::vector<std::string> metrics_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A "step" and an "end" record with every field a value of its own, so that a field lost,
// or two swapped, show.
constexpr const char* kStepLine =
    R"({"event": "step", "step": 7, "loss": 2.5, "tokens_per_s": 1234.5, "step_s": 0.125, )"
    R"("peak_activation_bytes": 11, "peak_step_bytes": 12, "optimizer_resident_bytes": 13, "gradient_bytes": 14, )"
    R"("checkpoint_host_bytes": 15, "optimizer_host_bytes": 16, "checkpoint_host_peak_bytes": 17, )"
    R"("tiers": {}})";  // no save of any tier yet
constexpr const char* kEndLine =
    R"({"event": "end", "first_step": 3, "last_step": 9, "seconds": 4.75, "first_loss": 5.5, "last_loss": 1.25, )"
    R"("peak_activation_bytes": 21, "peak_step_bytes": 22, "optimizer_resident_bytes": 23, "gradient_bytes": 24, )"
    R"("checkpoint_host_peak_bytes": 25, "checkpoint_host_budget_bytes": 26, "exit_status": 75})";

std::string invalid_argument_of(const std::string& line, bool as_step) {
  try {
    if (as_step) {
      parse_step_record(line);
    } else {
      parse_run_summary(line);
    }
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

// What the readers make of a record, MetricsFile writes again as it was.
TEST(MetricsFile, StepAndEndRecordsReadBackAsWritten) {
  ScratchDir dir;
  const std::string path = dir.sub("metrics.jsonl");
  const StepRecord step = parse_step_record(kStepLine);
  EXPECT_EQ(step.step, 7);
  EXPECT_EQ(step.total_steps, 0);  // not in the record
  EXPECT_EQ(step.step_s, 0.125);
  const RunSummary end = parse_run_summary(kEndLine);
  EXPECT_EQ(end.exit_status, 75);
  {
    MetricsFile metrics(path);
    metrics.step(step);
    metrics.end(end);
  }
  const std::vector<std::string> lines = metrics_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[0]), nlohmann::json::parse(kStepLine)) << lines[0];
  EXPECT_EQ(nlohmann::json::parse(lines[1]), nlohmann::json::parse(kEndLine)) << lines[1];
}

TEST(MetricsFile, ALineThatIsNoSuchRecordOrLacksAFieldIsRefusedByName) {
  EXPECT_NE(invalid_argument_of(R"({"event": "end", "first_step": 1})", /*as_step=*/true).find(R"(no "step" record)"),
            std::string::npos);
  EXPECT_NE(invalid_argument_of("not json", /*as_step=*/false).find(R"(no "end" record)"), std::string::npos);
  const std::string without_step_s =
      R"({"event": "step", "step": 1, "loss": 2, "tokens_per_s": 3, "peak_activation_bytes": 4, )"
      R"("peak_step_bytes": 5, "optimizer_resident_bytes": 6, "gradient_bytes": 7, "checkpoint_host_bytes": 8, )"
      R"("optimizer_host_bytes": 9})";
  EXPECT_NE(invalid_argument_of(without_step_s, /*as_step=*/true).find(R"(no number "step_s")"), std::string::npos);
}

}  // namespace
}  // namespace stowage::train
