#pragma once

// What `stowage train` shows while it runs: a one-line progress bar redrawn in place
// on a terminal, plain log lines otherwise, and a JSON-lines metrics file.

#include <stowage/train/events.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stowage::cli {

// One field of the progress line; fields with a larger `rank` are less important.
struct ProgressField {
  std::string text;
  int rank = 0;
};

// The fields of the progress line for a step, in display order, then the newest save of
// each checkpoint tier that has one (storage: "ckpt@30 staged 12 ms, committed 1.23 GB/s";
// memory: "mem@40 3 ms"; its replica on the peer node: "replica@40 51 ms"). Ranked from
// the step count (kept always), the loss, throughput, the bar, the tiers, the step time,
// down to the memory figures.
std::vector<ProgressField> progress_fields(const train::StepRecord& report, const train::CheckpointTiers& tiers);

// The fields joined by " | ", leaving out the least important ones until the line is
// at most `columns` characters; if even the most important field is longer, it is cut
// to `columns`.
std::string fit_progress_line(const std::vector<ProgressField>& fields, int columns);

// The events of a train::Trainer, shown: each also goes to metrics.jsonl (a
// train::MetricsFile), and a run's end is its summary line ("done: ...").
class Progress final : public train::EventSink {
 public:
  // Appends to `metrics_path`; `interactive` redraws one line (stdout is a terminal),
  // fitted to the terminal's width at each redraw, so that it follows resizes and never
  // wraps (a wrapped line would leave a new line behind at every redraw).
  Progress(const std::string& metrics_path, bool interactive, int64_t log_every);
  ~Progress() override;

  void step(const train::StepRecord& record) override;
  // A committed checkpoint, or a failed one (an event of its own in the metrics, and a
  // line on stderr).
  void checkpoint(const dcp::SaveReport& report) override;
  // A memory-tier save and where a resume came from: in the metrics (a failed memory
  // save is also a warning, the Trainer's).
  void memory_checkpoint(const dcp::MemorySaveReport& report) override;
  void memory_replication(const dcp::ReplicationReport& report) override;
  void restore(const dcp::TierRestore& restored) override;
  void end(const train::RunSummary& summary) override;
  // Any other line (resume notices, the summary): printed above the bar.
  void message(const std::string& text) override;
  // A line on stderr, above the bar.
  void warning(const std::string& text) override;
  // A record of the tool's own in metrics.jsonl (train::MetricsFile::record).
  void record(const std::string& json_object);

 private:
  void draw();

  train::MetricsFile metrics_;
  bool interactive_;
  int64_t log_every_;
  std::optional<train::StepRecord> last_step_;
};

}  // namespace stowage::cli
