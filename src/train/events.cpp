#include <stowage/train/events.h>

#include "util/errno_error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>

namespace stowage::train {

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
  record(nlohmann::json{{"event", "step"},
                        {"step", r.step},
                        {"loss", r.loss},
                        {"tokens_per_s", r.tokens_per_s},
                        {"step_s", r.step_s},
                        {"peak_activation_bytes", r.peak_activation_bytes},
                        {"peak_step_bytes", r.peak_step_bytes},
                        {"optimizer_resident_bytes", r.optimizer_resident_bytes},
                        {"gradient_bytes", r.gradient_bytes},
                        {"checkpoint_host_bytes", r.checkpoint_host_bytes},
                        {"optimizer_host_bytes", r.optimizer_host_bytes}}
             .dump());
}

void MetricsFile::checkpoint(const dcp::SaveReport& r) {
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
                        {"path", r.path}}
             .dump());
}

void MetricsFile::end(const RunSummary& s) {
  record(nlohmann::json{{"event", "end"},
                        {"first_step", s.first_step},
                        {"last_step", s.last_step},
                        {"seconds", s.seconds},
                        {"first_loss", s.first_loss},
                        {"last_loss", s.last_loss},
                        {"peak_activation_bytes", s.peak_activation_bytes},
                        {"peak_step_bytes", s.peak_step_bytes},
                        {"optimizer_resident_bytes", s.optimizer_resident_bytes},
                        {"gradient_bytes", s.gradient_bytes},
                        {"exit_status", s.exit_status}}
             .dump());
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
