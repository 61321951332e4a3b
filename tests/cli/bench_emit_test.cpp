// The benchmarks' one way to report (bench/lib/emit.h): a table's rows are JSON objects
// of their fields, and the same rows an aligned text table.
#include <emit.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <utility>

namespace stowage::bench {
namespace {

Table two_runs() {
  Table table;
  for (const auto& [times, step_s] : {std::pair{2, 0.5}, std::pair{16, 12.25}}) {
    table.add(Row()
                  .field("swap_times", times)
                  .field("step_s", step_s, "{:.3f}")
                  .text("step/plain", fmt::format("{:.2f}", step_s / 0.5))
                  .json("peak_bytes", times * 1024)
                  .field("mode", times == 2 ? "host" : "disk", "{}", "where"));
  }
  return table;
}

TEST(BenchTable, RowsAreTheJsonObjectsOfTheirFields) {
  const nlohmann::json expected = nlohmann::json::parse(R"([
    {"swap_times": 2, "step_s": 0.5, "peak_bytes": 2048, "mode": "host"},
    {"swap_times": 16, "step_s": 12.25, "peak_bytes": 16384, "mode": "disk"}])");
  EXPECT_EQ(two_runs().json(), expected);
  EXPECT_EQ(Table().json(), nlohmann::json::array());
}

TEST(BenchTable, TextAlignsEachColumnToItsWidestCell) {
  // Numbers right-aligned, strings left; text-only cells shown, JSON-only fields not.
  EXPECT_EQ(two_runs().text("  "),
            "  swap_times  step_s  step/plain  where\n"
            "           2   0.500        1.00  host\n"
            "          16  12.250       24.50  disk\n");
  EXPECT_EQ(Table().text(), "");
}

TEST(BenchTable, VerdictsReadMetOrNotMetAndAlignLeft) {
  Table table;
  table.add(Row().field("met", true).text("ratio", "0.50 (met)"));
  table.add(Row().field("met", false).text("ratio", "12.00 (NOT met)"));
  EXPECT_EQ(table.text(),
            "met                ratio\n"
            "met           0.50 (met)\n"
            "NOT met  12.00 (NOT met)\n");
  EXPECT_EQ(table.json(), nlohmann::json::parse(R"([{"met": true}, {"met": false}])"));
}

TEST(BenchTable, AMissingFigureReadsADashAlignedAsTheNumbersAndStaysOutOfTheJson) {
  Table table;
  table.add(Row().text("segments", "plain").missing("pt-nr step").field("step_s", 0.5, "{:.3f}"));
  table.add(Row().field("segments", 4).field("pt-nr step", 12.25, "{:.3f}").field("step_s", 1.0, "{:.3f}"));
  EXPECT_EQ(table.text(),
            "segments  pt-nr step  step_s\n"
            "plain              -   0.500\n"
            "4             12.250   1.000\n");
  EXPECT_EQ(table.json(),
            nlohmann::json::parse(R"([{"step_s": 0.5}, {"segments": 4, "pt-nr step": 12.25, "step_s": 1.0}])"));
}

}  // namespace
}  // namespace stowage::bench
