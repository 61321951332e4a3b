// The progress line of `stowage train` fits the terminal: as a unit for several widths,
// and in real runs under a pseudo-terminal (script(1)) of a given width.
#include "cli/train_util.h"

#include "train_progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

const std::string kCheckpoint = "ckpt@1200 staged 12 ms, committed 1.23 GB/s";

TEST(ProgressLine, AWideTerminalShowsEveryField) {
  const std::string line = fit_progress_line(progress_fields(a_step(), kCheckpoint), 400);
  for (const char* field : {"1234/100000", "[", "loss 2.346", "123456 tok/s", "42 ms", "act 3.0 GiB", "optim 5.0 MiB",
                            "grads 6.0 MiB", "peak 4.0 GiB", "host ckpt 700.0 MiB + swap 800.0 MiB", "ckpt@1200"}) {
    EXPECT_THAT(line, HasSubstr(field));
  }
}

TEST(ProgressLine, NarrowerTerminalsDropTheLeastImportantFieldsFirst) {
  const std::vector<ProgressField> fields = progress_fields(a_step(), kCheckpoint);
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

}  // namespace
}  // namespace stowage::cli
