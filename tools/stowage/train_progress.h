#pragma once

// What `stowage train` shows while it runs: a one-line progress bar redrawn in place
// on a terminal, plain log lines otherwise, and a JSON-lines metrics file.

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace stowage::cli {

struct StepReport {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double step_s = 0;
  int64_t peak_activation_bytes = 0;   // peak allocator bytes during forward + backward
  int64_t optimizer_resident_bytes = 0;  // optimizer state held in device memory between steps
  int64_t staging_bytes = 0;           // host staging buffers (checkpoint + swap)
};

struct CheckpointReport {
  int64_t step = 0;
  double staged_ms = 0;      // caller blocked by async_save
  double committed_gbps = 0;  // bytes / time from the start of the save to its commit
  int64_t bytes = 0;
  std::string path;
};

class Progress {
 public:
  // Appends to `metrics_path`; `interactive` redraws one line (a terminal).
  Progress(const std::string& metrics_path, bool interactive, int64_t log_every);
  ~Progress();

  void step(const StepReport& report);
  void checkpoint(const CheckpointReport& report);
  // Any other line (resume notices, the summary): printed above the bar.
  void message(const std::string& text);

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
