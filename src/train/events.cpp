#include <stowage/train/events.h>

#include <stowage/error.h>

#include "util/errno_error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <type_traits>

namespace stowage::train {
namespace {

// A record's fields beside their keys in metrics.jsonl: MetricsFile writes by these lists,
// parse_step_record() and parse_run_summary() read by them.
template <typename Step, typename Field>
void step_fields(Step& r, Field&& field) {
  field("step", r.step);
  field("loss", r.loss);
  field("tokens_per_s", r.tokens_per_s);
  field("step_s", r.step_s);
  field("peak_activation_bytes", r.peak_activation_bytes);
  field("peak_step_bytes", r.peak_step_bytes);
  field("optimizer_resident_bytes", r.optimizer_resident_bytes);
  field("gradient_bytes", r.gradient_bytes);
  field("checkpoint_host_bytes", r.checkpoint_host_bytes);
  field("optimizer_host_bytes", r.optimizer_host_bytes);
  field("checkpoint_host_peak_bytes", r.checkpoint_host_peak_bytes);
}

template <typename Summary, typename Field>
void summary_fields(Summary& s, Field&& field) {
  field("first_step", s.first_step);
  field("last_step", s.last_step);
  field("seconds", s.seconds);
  field("first_loss", s.first_loss);
  field("last_loss", s.last_loss);
  field("peak_activation_bytes", s.peak_activation_bytes);
  field("peak_step_bytes", s.peak_step_bytes);
  field("optimizer_resident_bytes", s.optimizer_resident_bytes);
  field("gradient_bytes", s.gradient_bytes);
  field("checkpoint_host_peak_bytes", s.checkpoint_host_peak_bytes);
  field("checkpoint_host_budget_bytes", s.checkpoint_host_budget_bytes);
  field("exit_status", s.exit_status);
}

// The JSON object of one record whose fields `fields` lists.
template <typename Record, typename Fields>
nlohmann::json record_line(const char* event, const Record& record, Fields&& fields) {
  nlohmann::json out{{"event", event}};
  fields(record, [&out](const char* key, const auto& value) { out[key] = value; });
  return out;
}

// A step record's "tiers": each tier's newest step and its time.
nlohmann::json tiers_json(const CheckpointTiers& tiers) {
  nlohmann::json out = nlohmann::json::object();
  const auto add = [&out](const char* tier, int64_t step, double seconds) {
    out[tier] = {{"step", step}, {"ms", seconds * 1e3}};
  };
  if (tiers.memory) add("memory", tiers.memory->step, tiers.memory->save_s);
  if (tiers.replica) add("replica", tiers.replica->step, tiers.replica->replicate_s);
  if (tiers.storage) add("storage", tiers.storage->step, tiers.storage->commit_s);
  return out;
}

// Reads a record's fields back from `line`, a record of `event`.
template <typename Record, typename Fields>
Record parse_record(const std::string& line, const char* event, Fields&& fields) {
  const nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!in.is_object() || !in.contains("event") || in["event"] != event) {
    throw InvalidArgument(fmt::format("no \"{}\" record of metrics.jsonl: {}", event, line));
  }
  Record record;
  fields(record, [&](const char* key, auto& value) {
    const auto found = in.find(key);
    if (found == in.end() || !found->is_number()) {
      throw InvalidArgument(
          fmt::format("the \"{}\" record of metrics.jsonl has no number \"{}\": {}", event, key, line));
    }
    value = found->template get<std::decay_t<decltype(value)>>();
  });
  return record;
}

}  // namespace

void CheckpointTiers::record(const dcp::MemorySaveReport& report) {
  if (report.error.empty()) memory = report;
}

void CheckpointTiers::record(const dcp::ReplicationReport& report) {
  if (report.error.empty()) replica = report;
}

void CheckpointTiers::record(const dcp::SaveReport& report) {
  if (report.committed) storage = report;
}

double committed_gbps(const dcp::SaveReport& report) {
  return report.commit_s > 0 ? static_cast<double>(report.bytes) / report.commit_s / 1e9 : 0.0;
}

MetricsFile::MetricsFile(const std::string& path) : path_(path), file_(path, std::ios::app) {
  if (!file_) util::throw_errno("cannot open the metrics file", path, "open", errno);
}

void MetricsFile::record(const std::string& json_object) {
  // Each record reaches the file as it is written, so that a run killed (SIGKILL, a
  // crash) loses at most the line being written.
  file_ << json_object << '\n';
  file_.flush();
}

void MetricsFile::step(const StepRecord& r) {
  nlohmann::json line = record_line("step", r, [](const StepRecord& each, auto&& field) { step_fields(each, field); });
  line["tiers"] = tiers_json(tiers_);
  record(line.dump());
}

void MetricsFile::checkpoint(const dcp::SaveReport& r) {
  tiers_.record(r);
  if (!r.committed) {
    record(
        nlohmann::json{{"event", "checkpoint_failed"}, {"step", r.step}, {"path", r.path}, {"error", r.error}}.dump());
    return;
  }
  record(nlohmann::json{{"event", "checkpoint"},
                        {"step", r.step},
                        {"staged_ms", r.blocked_s * 1e3},
                        {"committed_gbps", committed_gbps(r)},
                        {"bytes", r.bytes},
                        {"host_peak_bytes", r.host_peak_bytes},
                        {"path", r.path}}
             .dump());
}

void MetricsFile::memory_checkpoint(const dcp::MemorySaveReport& r) {
  tiers_.record(r);
  record(nlohmann::json{{"event", r.error.empty() ? "memory_checkpoint" : "memory_checkpoint_failed"},
                        {"step", r.step},
                        {"bytes", r.bytes},
                        {"save_ms", r.save_s * 1e3},
                        {"error", r.error}}
             .dump());
}

void MetricsFile::memory_replication(const dcp::ReplicationReport& r) {
  tiers_.record(r);
  record(nlohmann::json{{"event", r.error.empty() ? "memory_replication" : "memory_replication_failed"},
                        {"step", r.step},
                        {"replicate_ms", r.replicate_s * 1e3},
                        {"error", r.error}}
             .dump());
}

void MetricsFile::restore(const dcp::TierRestore& restored) {
  record(nlohmann::json{{"event", "restore"},
                        {"step", restored.step.value_or(0)},
                        {"tier", dcp::restore_tier_name(restored.tier)},
                        {"fetched_ranks", restored.fetched_ranks},
                        {"skipped", restored.skipped}}
             .dump());
}

void MetricsFile::end(const RunSummary& s) {
  record(record_line("end", s, [](const RunSummary& each, auto&& field) { summary_fields(each, field); }).dump());
}

StepRecord parse_step_record(const std::string& line) {
  return parse_record<StepRecord>(line, "step", [](StepRecord& each, auto&& field) { step_fields(each, field); });
}

RunSummary parse_run_summary(const std::string& line) {
  return parse_record<RunSummary>(line, "end", [](RunSummary& each, auto&& field) { summary_fields(each, field); });
}

void MetricsFile::message(const std::string& text) {
  fmt::print("{}\n", text);
  std::fflush(stdout);
}

void MetricsFile::warning(const std::string& text) {
  std::fflush(stdout);
  fmt::print(stderr, "{}\n", text);
  std::fflush(stderr);
}

}  // namespace stowage::train
