#pragma once

// What `stowage train` shows while it runs: a one-line progress bar redrawn in place
// on a terminal, plain log lines otherwise, and a JSON-lines metrics file.

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace stowage::cli {

struct StepReport {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double step_s = 0;
  int64_t peak_activation_bytes = 0;     // peak allocator bytes during forward + backward
  int64_t peak_step_bytes = 0;           // peak device bytes of the whole step beyond the parameters
  int64_t optimizer_resident_bytes = 0;  // optimizer state held in device memory between steps
  int64_t gradient_bytes = 0;            // gradients held in device memory between steps
  int64_t checkpoint_host_bytes = 0;     // host buffers of checkpoint staging
  int64_t optimizer_host_bytes = 0;      // host buffers of the optimizer's swapped states
};

struct CheckpointReport {
  int64_t step = 0;
  bool committed = true;
  // Failed: why. Committed: older checkpoints that could not be removed, if any.
  std::string error;
  double staged_ms = 0;       // caller blocked by async_save
  double committed_gbps = 0;  // bytes / time from the start of the save to its commit
  int64_t bytes = 0;
  std::string path;
};

// One field of the progress line; fields with a larger `rank` are less important.
struct ProgressField {
  std::string text;
  int rank = 0;
};

// The fields of the progress line for a step, in display order, and the last
// checkpoint's summary (empty: none yet). Ranked from the step count (kept always),
// the loss, throughput, the bar, the last checkpoint, the step time, down to the
// memory figures.
std::vector<ProgressField> progress_fields(const StepReport& report, const std::string& last_checkpoint);

// The fields joined by " | ", leaving out the least important ones until the line is
// at most `columns` characters; if even the most important field is longer, it is cut
// to `columns`.
std::string fit_progress_line(const std::vector<ProgressField>& fields, int columns);

class Progress {
 public:
  // Appends to `metrics_path`; `interactive` redraws one line (stdout is a terminal),
  // fitted to the terminal's width at each redraw, so that it follows resizes and never
  // wraps (a wrapped line would leave a new line behind at every redraw).
  Progress(const std::string& metrics_path, bool interactive, int64_t log_every);
  ~Progress();

  void step(const StepReport& report);
  // A committed checkpoint, or a failed one (an event of its own in the metrics, and a
  // line on stderr).
  void checkpoint(const CheckpointReport& report);
  // Any other line (resume notices, the summary): printed above the bar.
  void message(const std::string& text);
  // A line on stderr, above the bar.
  void warning(const std::string& text);

 private:
  void draw();

  std::ofstream metrics_;
  bool interactive_;
  int64_t log_every_;
  std::optional<StepReport> last_step_;
  std::string last_checkpoint_;
};

std::string format_bytes(int64_t bytes);

}  // namespace stowage::cli
