// `stowage bench --report DIR`: the page of a real (small) run, loaded in a real headless
// browser (Debian's chromium), draws every chart its report.json lists. The page's own
// script measures each chart's marks once laid out (bars, limit lines, curves: how many,
// how many of nonzero size) and writes that into #chart-check, which the test reads from
// the DOM chromium dumps. No figure is judged here.

#include "cli/cli_util.h"

#include <stowage/build_info.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace stowage::testing {
namespace {
namespace fs = std::filesystem;

constexpr const char* kChromium = "/usr/bin/chromium";

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json read_json(const fs::path& path) {
  return nlohmann::json::parse(read_text(path), nullptr, /*allow_exceptions=*/false);
}

// What the page's script found, per chart id, in the DOM chromium dumps once loaded.
nlohmann::json rendered_charts(const fs::path& page) {
  const auto result = run_command(std::string(kChromium) + " --headless --no-sandbox --disable-gpu --dump-dom file://" +
                                  page.string() + " 2>/dev/null");
  EXPECT_EQ(result.status, 0) << result.output.substr(0, 2000);
  const std::string open = "<pre id=\"chart-check\">";
  const size_t start = result.output.find(open);
  const size_t end = result.output.find("</pre>", start);
  if (start == std::string::npos || end == std::string::npos) return nullptr;
  return nlohmann::json::parse(result.output.substr(start + open.size(), end - start - open.size()), nullptr, false);
}

// Every chart of `dir`/report.json drawn in the browser: as many marks as the report
// says, each of nonzero size, in an SVG of nonzero size. Returns the charts.
nlohmann::json expect_every_chart_drawn(const fs::path& dir) {
  const nlohmann::json report = read_json(dir / "report.json");
  EXPECT_TRUE(report.is_object() && report.contains("charts")) << "no charts in " << dir / "report.json";
  if (!report.is_object()) return nlohmann::json::array();
  const nlohmann::json rendered = rendered_charts(dir / "index.html");
  EXPECT_TRUE(rendered.is_object()) << "the page's check did not run: no JSON in #chart-check";
  if (!rendered.is_object()) return report["charts"];
  EXPECT_EQ(rendered.size(), report["charts"].size()) << rendered.dump();
  for (const nlohmann::json& chart : report["charts"]) {
    const std::string id = chart["id"];
    if (!rendered.contains(id)) {
      ADD_FAILURE() << "chart " << id << " is not on the page: " << rendered.dump();
      continue;
    }
    const nlohmann::json& seen = rendered[id];
    EXPECT_GT(chart["marks"].get<int>(), 0) << id;
    EXPECT_EQ(seen["marks"], chart["marks"]) << id;
    EXPECT_EQ(seen["drawn"], seen["marks"]) << id << ": marks of zero size";
    EXPECT_GT(seen["width"].get<double>(), 0) << id;
    EXPECT_GT(seen["height"].get<double>(), 0) << id;
  }
  return report["charts"];
}

const nlohmann::json* chart_by_id(const nlohmann::json& charts, const std::string& id) {
  for (const nlohmann::json& chart : charts) {
    if (chart["id"] == id) return &chart;
  }
  return nullptr;
}

class BenchReport : public ::testing::Test {
 protected:
  // One small real run for every test here: its report in `dir_`/run.
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("stowage-report-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    const auto result = run_command(stowage_binary() + " bench --quick --report " + (dir_ / "run").string());
    run_status_ = result.status;
    run_output_ = result.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  void SetUp() override {
    if (!fs::exists(kChromium)) GTEST_SKIP() << kChromium << " is not installed (scripts/setup.sh installs it)";
    ASSERT_EQ(run_status_, 0) << run_output_;
  }

  static fs::path dir_;
  static int run_status_;
  static std::string run_output_;
};
fs::path BenchReport::dir_;
int BenchReport::run_status_ = -1;
std::string BenchReport::run_output_;

TEST_F(BenchReport, EveryChartOfARealRunIsDrawnInChromium) {
  const std::string page = read_text(dir_ / "run" / "index.html");
  // Self-contained: nothing to fetch (the SVG namespace is a name, not a fetch).
  EXPECT_EQ(page.find("<script src"), std::string::npos);
  EXPECT_EQ(page.find("<link"), std::string::npos);
  EXPECT_EQ(page.find("https://"), std::string::npos);

  const nlohmann::json charts = expect_every_chart_drawn(dir_ / "run");
  std::vector<std::string> ids{"targets",
                               "dcp-save",
                               "dcp-load-stage",
                               "dcp-async",
                               "activation-step",
                               "activation-peak",
                               "activation-train-peak-cpu-seq16",
                               "activation-train-step-cpu-seq32",
                               "swap-step",
                               "swap-peak",
                               "memory-timeline"};
  if (build_info().with_sim) ids.emplace_back("activation-train-peak-sim-seq32");
  for (const std::string& id : ids) EXPECT_NE(chart_by_id(charts, id), nullptr) << "no chart " << id;
  // The simulator's time is no device's: no chart of it.
  EXPECT_EQ(chart_by_id(charts, "activation-train-step-sim-seq32"), nullptr);
  // The train model's goals are targets: selective recompute's peak and time for each of
  // its two sites, and the one budget's peak. (The targets chart leaves out a ratio that
  // is not positive, as a time overhead within the noise can be; the table has each.)
  const nlohmann::json targets = read_json(dir_ / "run" / "report.json")["results"]["targets"];
  int train_goals = 0;
  for (const nlohmann::json& row : targets) {
    if (row["figure"].get<std::string>().find(", seq 32 (cpu)") != std::string::npos) ++train_goals;
  }
  EXPECT_EQ(train_goals, 5) << targets.dump();
  const nlohmann::json* timeline = chart_by_id(charts, "memory-timeline");
  ASSERT_NE(timeline, nullptr);
  ASSERT_EQ((*timeline)["series"].size(), 3u) << "plain, checkpointed, swapped";
  for (const nlohmann::json& series : (*timeline)["series"]) EXPECT_GE(series["points"].size(), 2u);
}

// A run with Python peers (as --peer records them, here added to the real run's JSON, so
// that this test needs no torch wheel): each peer figure is drawn beside stowage's, a
// figure no chart knows gets one of its own, and the others still show their limits.
TEST_F(BenchReport, PeerFiguresAreDrawnBesideStowages) {
  nlohmann::json results = read_json(dir_ / "run" / "report.json")["results"];
  results["dcp"]["pytorch_dcp_save_two_threads_gbps"] = 0.7;
  results["dcp"]["pytorch_dcp_load_gbps"] = 1.5;
  results["dcp"]["pytorch_dcp_future_figure_s"] = 0.25;
  results["activation"]["pytorch_plain_step_s"] = 0.001;
  results["activation"]["runs"][0]["pytorch_step_s"] = 0.002;
  results["train"] = {{"stowage_tokens_per_s", 9000.0}, {"pytorch_tokens_per_s", 8000.0}};
  const fs::path saved = dir_ / "with-peers.json";
  std::ofstream(saved) << results.dump();
  const auto result =
      run_command(stowage_binary() + " bench --from " + saved.string() + " --report " + (dir_ / "peers").string());
  ASSERT_EQ(result.status, 0) << result.output;

  const nlohmann::json charts = expect_every_chart_drawn(dir_ / "peers");
  const auto roles_in = [&](const std::string& id, const std::string& group) {
    std::string roles;
    const nlohmann::json* chart = chart_by_id(charts, id);
    if (chart == nullptr) return roles;
    for (const nlohmann::json& g : (*chart)["groups"]) {
      if (g["label"] != group) continue;
      for (const nlohmann::json& bar : g["bars"]) roles += bar["role"].get<std::string>() + " ";
    }
    return roles;
  };
  EXPECT_EQ(roles_in("dcp-save", "2 writer threads"), "stowage pytorch libtorch ");
  EXPECT_EQ(roles_in("dcp-save", "1 writer thread"), "stowage ");  // that peer did not run
  EXPECT_EQ(roles_in("dcp-load-stage", "load"), "stowage pytorch libtorch ");
  EXPECT_EQ(roles_in("activation-step", "plain"), "stowage pytorch ");
  EXPECT_NE(chart_by_id(charts, "dcp-pytorch_dcp_future_figure_s"), nullptr);
  EXPECT_EQ(roles_in("train-pytorch_tokens_per_s", "train"), "stowage pytorch ");
}

// The train model's activation peaks (bench activation --train-model, here a small real
// run drawn with --from) are drawn against what each mode is asked to stay under: a budget
// row against its budget, selective recompute against half of none's peak.
TEST(BenchReportTrainModel, PeaksAreDrawnAgainstTheirBudgetsAndGoals) {
  if (!fs::exists(kChromium)) GTEST_SKIP() << kChromium << " is not installed (scripts/setup.sh installs it)";
  const auto run = run_command(stowage_binary() +
                               " bench activation --train-model --train-layers 2 --train-width 32 --seq-lens 32 "
                               "--train-steps 3 --train-rounds 1 --budget-shares 0.25 0.75 --json");
  ASSERT_EQ(run.status, 0) << run.output;
  const fs::path dir = fs::temp_directory_path() / ("stowage-report-train-model-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "run.json")
      << nlohmann::json{{"activation_train", nlohmann::json::parse(last_json_line(run.output))}}.dump();
  const auto drawn = run_command(stowage_binary() + " bench --from " + (dir / "run.json").string() + " --report " +
                                 (dir / "report").string());
  ASSERT_EQ(drawn.status, 0) << drawn.output;
  const nlohmann::json charts = expect_every_chart_drawn(dir / "report");
  const nlohmann::json* chart = chart_by_id(charts, "activation-train-peak-cpu-seq32");
  ASSERT_NE(chart, nullptr) << charts.dump();
  EXPECT_NE(chart_by_id(charts, "activation-train-step-cpu-seq32"), nullptr);
  std::map<std::string, nlohmann::json> groups;
  for (const nlohmann::json& group : (*chart)["groups"]) groups[group["label"].get<std::string>()] = group;
  ASSERT_EQ(groups.count("none"), 1u) << chart->dump();
  ASSERT_EQ(groups.count("mlp"), 1u) << chart->dump();
  EXPECT_FALSE(groups["none"].contains("limit"));
  EXPECT_EQ(groups["mlp"]["limit"]["label"], "the goal");
  EXPECT_NEAR(groups["mlp"]["limit"]["value"].get<double>(), groups["none"]["bars"][0]["value"].get<double>() / 2,
              1e-3);
  int budgets = 0;
  for (const auto& [label, group] : groups) {
    if (label.rfind("budget", 0) != 0) continue;
    ++budgets;
    EXPECT_EQ(group["limit"]["label"], "its budget") << label;
    EXPECT_LE(group["bars"][0]["value"].get<double>(), group["limit"]["value"].get<double>()) << label;
  }
  EXPECT_EQ(budgets, 2) << chart->dump();
  fs::remove_all(dir);
}

TEST(BenchReportOptions, AReportDirectoryThatCannotBeCreatedIsNamedBeforeAnythingRuns) {
  const fs::path file = fs::temp_directory_path() / ("stowage-report-file-" + std::to_string(getpid()));
  std::ofstream(file) << "in the way\n";
  const auto result = run_command(stowage_binary() + " bench --quick --report " + (file / "report").string());
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find((file / "report").string()), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("benchmark"), std::string::npos) << "it ran the benchmarks: " << result.output;
  fs::remove(file);
}

TEST(BenchReportOptions, WithoutMatplotlibTheRunFailsBeforeItStartsNamingThePackage) {
  // A matplotlib that fails to import, ahead of Debian's on the script's path.
  const fs::path shadow = fs::temp_directory_path() / ("stowage-no-matplotlib-" + std::to_string(getpid()));
  fs::create_directories(shadow / "matplotlib");
  std::ofstream(shadow / "matplotlib" / "__init__.py") << "raise ImportError('hidden by the test')\n";
  const auto result = run_command("PYTHONPATH=" + shadow.string() + " " + stowage_binary() +
                                  " bench --quick --report " + (shadow / "report").string());
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("python3-matplotlib"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("benchmark"), std::string::npos) << "it ran the benchmarks: " << result.output;
  fs::remove_all(shadow);
}

}  // namespace
}  // namespace stowage::testing
