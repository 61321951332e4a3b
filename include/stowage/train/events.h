#pragma once

// What a training run reports as it goes: each step's figures, each checkpoint that
// ended, and lines for its user (a resume, a skipped checkpoint, a preemption). A
// train::Trainer sends them, on rank 0 only, to the EventSink of its options; the
// default is a MetricsFile, <run_dir>/metrics.jsonl. `stowage train` adds its progress
// line on top of one.
//
// metrics.jsonl holds one JSON object a line, each written and flushed whole, so that a
// killed run loses at most the line being written:
//   {"event": "step", "step", "loss", "tokens_per_s", "step_s", "peak_activation_bytes",
//    "peak_step_bytes", "optimizer_resident_bytes", "gradient_bytes",
//    "checkpoint_host_bytes", "optimizer_host_bytes", "checkpoint_host_peak_bytes",
//    "tiers": {"memory": {"step", "ms"}, "replica": {"step", "ms"}, "storage": {"step",
//              "ms"}}}  (each tier's newest save, CheckpointTiers, and its time: the
//              write into memory, the replication, the storage's commit; a tier
//              without a save yet is left out)
//   {"event": "checkpoint", "step", "staged_ms", "committed_gbps", "bytes", "host_peak_bytes", "path"}
//   {"event": "memory_checkpoint", "step", "bytes", "save_ms", "error"}
//    ("memory_checkpoint_failed" when error is not empty)
//   {"event": "memory_replication", "step", "replicate_ms", "error"} (its replication to
//    the peers, which ends in the background: "memory_replication_failed" on an error)
//   {"event": "restore", "step", "tier", "fetched_ranks", "skipped"}
//   {"event": "checkpoint_failed", "step", "path", "error"}
//   {"event": "end", "first_step", "last_step", "seconds", "first_loss", "last_loss",
//    "peak_activation_bytes", "peak_step_bytes", "optimizer_resident_bytes",
//    "gradient_bytes", "checkpoint_host_peak_bytes", "checkpoint_host_budget_bytes", "exit_status"}

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/memory_tier.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace stowage::train {

// One trained step, as measured on this rank (the loss: the mean over the ranks).
struct StepRecord {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;               // TrainerOptions::tokens_per_step / step_s; 0 without it
  double step_s = 0;                     // from the end of the step before: a save's blocking counts
  int64_t peak_activation_bytes = 0;     // device bytes allocated during forward + backward, at peak
  int64_t peak_step_bytes = 0;           // device bytes of the whole step beyond the parameters, at peak
  int64_t optimizer_resident_bytes = 0;  // optimizer state in device memory between steps
  int64_t gradient_bytes = 0;            // gradients in device memory between steps
  int64_t checkpoint_host_bytes = 0;     // host buffers of checkpoint staging
  int64_t optimizer_host_bytes = 0;      // host buffers of the optimizer's swapped states
  // Host bytes checkpointing held at their peak since the step before: the staging
  // buffers' high-water mark (memory::host_buffer_stats) plus the memory tier's files.
  int64_t checkpoint_host_peak_bytes = 0;
};

// A committed save's throughput: its bytes over the time from save() to its commit, in
// GB/s (0 when no time was measured). metrics.jsonl's "committed_gbps".
double committed_gbps(const dcp::SaveReport& report);

// The newest save of each checkpoint tier that a run could restore from now: its own
// memory, the replica its peer node holds, and storage. Each sink keeps one from the
// reports it gets (record); a failed save changes nothing.
struct CheckpointTiers {
  std::optional<dcp::MemorySaveReport> memory;    // its step and save_s: the write into memory
  std::optional<dcp::ReplicationReport> replica;  // its step and replicate_s; none on one node
  std::optional<dcp::SaveReport> storage;         // committed: its step, blocked_s and commit_s
  void record(const dcp::MemorySaveReport& report);
  void record(const dcp::ReplicationReport& report);
  void record(const dcp::SaveReport& report);
};

// A run's end, as Trainer::finish() reports it.
struct RunSummary {
  int64_t first_step = 0;  // the first step this process trained; > last_step: none
  int64_t last_step = 0;
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
  int64_t peak_activation_bytes = 0;  // the largest of any step
  int64_t peak_step_bytes = 0;
  int64_t optimizer_resident_bytes = 0;  // after the last step
  int64_t gradient_bytes = 0;
  int64_t checkpoint_host_peak_bytes = 0;    // the largest of any step
  int64_t checkpoint_host_budget_bytes = 0;  // TrainerOptions::checkpoint_host_budget_bytes
  int exit_status = 0;                       // Trainer::finish()'s
};

// A "step" or "end" line of metrics.jsonl read back (what a program that ran training
// reads of it): the fields MetricsFile::step() and end() wrote, by the same list
// (StepRecord::total_steps is not written, and stays 0). Throws InvalidArgument naming the
// line when it is no such record, or the field it lacks.
StepRecord parse_step_record(const std::string& line);
RunSummary parse_run_summary(const std::string& line);

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void step(const StepRecord& record) = 0;
  // A save that ended: committed, or failed (report.error says why).
  virtual void checkpoint(const dcp::SaveReport& report) = 0;
  // A save into the memory tier (TrainerOptions::memory_checkpoints); none by default.
  virtual void memory_checkpoint(const dcp::MemorySaveReport& /*report*/) {}
  // Its replication to the peer nodes, which ended; none by default.
  virtual void memory_replication(const dcp::ReplicationReport& /*report*/) {}
  // Where the run resumed from (its step and tier); none by default.
  virtual void restore(const dcp::TierRestore& /*restored*/) {}
  virtual void end(const RunSummary& summary) = 0;
  // A line for the run's user; a warning is about something that went wrong.
  virtual void message(const std::string& text) = 0;
  virtual void warning(const std::string& text) = 0;
};

// metrics.jsonl: appends the records above to `path`; messages go to stdout, warnings to
// stderr. Throws IoError when `path` cannot be opened for appending.
class MetricsFile : public EventSink {
 public:
  explicit MetricsFile(const std::string& path);

  void step(const StepRecord& record) override;
  void checkpoint(const dcp::SaveReport& report) override;
  // {"event": "memory_checkpoint", ...} and {"event": "restore", "step", "tier", ...}.
  void memory_checkpoint(const dcp::MemorySaveReport& report) override;
  // {"event": "memory_replication", ...}.
  void memory_replication(const dcp::ReplicationReport& report) override;
  void restore(const dcp::TierRestore& restored) override;
  void end(const RunSummary& summary) override;
  void message(const std::string& text) override;
  void warning(const std::string& text) override;

  // A record of the program's own, written and flushed as the others: one JSON object
  // whose "event" names it (`stowage train` adds "setup": what its flags picked).
  void record(const std::string& json_object);

  // The tiers' newest saves, from the reports this file has recorded.
  const CheckpointTiers& tiers() const { return tiers_; }

 private:
  std::string path_;
  std::ofstream file_;
  CheckpointTiers tiers_;
};

}  // namespace stowage::train
