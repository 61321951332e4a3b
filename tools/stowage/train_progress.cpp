#include "train_progress.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>

namespace stowage::cli {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

Progress::Progress(const std::string& metrics_path, bool interactive, int64_t log_every)
    : metrics_(metrics_path, std::ios::app), interactive_(interactive), log_every_(log_every) {
  if (!metrics_) {
    throw Error(fmt::format("cannot open the metrics file '{}'", metrics_path));
  }
}

Progress::~Progress() {
  if (interactive_ && last_step_) {
    std::fputc('\n', stdout);
  }
}

void Progress::step(const StepReport& r) {
  metrics_ << nlohmann::json{{"event", "step"},
                             {"step", r.step},
                             {"loss", r.loss},
                             {"tokens_per_s", r.tokens_per_s},
                             {"step_s", r.step_s},
                             {"peak_activation_bytes", r.peak_activation_bytes},
                             {"optimizer_resident_bytes", r.optimizer_resident_bytes},
                             {"staging_bytes", r.staging_bytes}}
                  .dump()
           << '\n';
  // Each record reaches the file as it is written, so that a run killed (SIGKILL, a
  // crash) loses at most the line being written.
  metrics_.flush();
  last_step_ = r;
  if (interactive_) {
    draw();
  } else if (r.step % log_every_ == 0 || r.step == r.total_steps) {
    fmt::print("step {}/{} loss {:.4f} {:.0f} tok/s {:.0f} ms/step act-peak {} optim-resident {} staging {}\n", r.step,
               r.total_steps, r.loss, r.tokens_per_s, r.step_s * 1e3, format_bytes(r.peak_activation_bytes),
               format_bytes(r.optimizer_resident_bytes), format_bytes(r.staging_bytes));
    std::fflush(stdout);
  }
}

void Progress::checkpoint(const CheckpointReport& r) {
  metrics_ << nlohmann::json{{"event", "checkpoint"}, {"step", r.step},      {"staged_ms", r.staged_ms},
                             {"committed_gbps", r.committed_gbps}, {"bytes", r.bytes}, {"path", r.path}}
                  .dump()
           << '\n';
  metrics_.flush();
  last_checkpoint_ = fmt::format("ckpt@{} staged {:.0f} ms, committed {:.2f} GB/s", r.step, r.staged_ms,
                                 r.committed_gbps);
  if (interactive_) {
    draw();
  } else {
    fmt::print("checkpoint step {}: {} staged in {:.1f} ms, committed at {:.2f} GB/s -> {}\n", r.step,
               format_bytes(r.bytes), r.staged_ms, r.committed_gbps, r.path);
    std::fflush(stdout);
  }
}

void Progress::message(const std::string& text) {
  if (interactive_ && last_step_) {
    fmt::print("\r\033[2K{}\n", text);
    draw();
  } else {
    fmt::print("{}\n", text);
  }
  std::fflush(stdout);
}

void Progress::draw() {
  if (!last_step_) return;
  const StepReport& r = *last_step_;
  constexpr int kWidth = 24;
  const int filled = r.total_steps > 0 ? static_cast<int>(kWidth * r.step / r.total_steps) : 0;
  fmt::print("\r\033[2K{:>6}/{} [{}{}] loss {:.3f} | {:.0f} tok/s | {:.0f} ms | act {} | optim {} | staging {}{}{}",
             r.step, r.total_steps, std::string(filled, '#'), std::string(kWidth - filled, '.'), r.loss,
             r.tokens_per_s, r.step_s * 1e3, format_bytes(r.peak_activation_bytes),
             format_bytes(r.optimizer_resident_bytes), format_bytes(r.staging_bytes),
             last_checkpoint_.empty() ? "" : " | ", last_checkpoint_);
  std::fflush(stdout);
}

}  // namespace stowage::cli
