#include "train_progress.h"

#include <stowage/byte_count.h>
#include <stowage/dist/preemption.h>

#include <stowage/error.h>

#include <fmt/format.h>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace stowage::cli {

namespace {

// The terminal's width in columns: the kernel's for stdout, else $COLUMNS, else 80.
int terminal_columns() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    return size.ws_col;
  }
  const char* columns = std::getenv("COLUMNS");
  const int parsed = columns != nullptr ? std::atoi(columns) : 0;
  return parsed > 0 ? parsed : 80;
}

// The memory tier's newest save and replica, each when there is one.
std::vector<std::string> memory_tier_texts(const train::CheckpointTiers& tiers) {
  std::vector<std::string> texts;
  if (tiers.memory) texts.push_back(fmt::format("mem@{} {:.0f} ms", tiers.memory->step, tiers.memory->save_s * 1e3));
  if (tiers.replica) {
    texts.push_back(fmt::format("replica@{} {:.0f} ms", tiers.replica->step, tiers.replica->replicate_s * 1e3));
  }
  return texts;
}

// Each tier's newest save, storage first.
std::vector<std::string> tier_texts(const train::CheckpointTiers& tiers) {
  std::vector<std::string> texts;
  if (tiers.storage) {
    texts.push_back(fmt::format("ckpt@{} staged {:.0f} ms, committed {:.2f} GB/s", tiers.storage->step,
                                tiers.storage->blocked_s * 1e3, train::committed_gbps(*tiers.storage)));
  }
  for (std::string& text : memory_tier_texts(tiers)) texts.push_back(std::move(text));
  return texts;
}

}  // namespace

std::vector<ProgressField> progress_fields(const train::StepRecord& r, const train::CheckpointTiers& tiers) {
  constexpr int kBarWidth = 24;
  const int filled = r.total_steps > 0 ? static_cast<int>(kBarWidth * r.step / r.total_steps) : 0;
  std::vector<ProgressField> fields = {
      {fmt::format("{:>6}/{}", r.step, r.total_steps), 0},
      {fmt::format("[{}{}]", std::string(filled, '#'), std::string(kBarWidth - filled, '.')), 3},
      {fmt::format("loss {:.3f}", r.loss), 1},
      {fmt::format("{:.0f} tok/s", r.tokens_per_s), 2},
      {fmt::format("{:.0f} ms", r.step_s * 1e3), 5},
      {fmt::format("act {}", bytes_in_units(r.peak_activation_bytes)), 6},
      {fmt::format("optim {}", bytes_in_units(r.optimizer_resident_bytes)), 7},
      {fmt::format("grads {}", bytes_in_units(r.gradient_bytes)), 8},
      {fmt::format("peak {}", bytes_in_units(r.peak_step_bytes)), 9},
      {fmt::format("host ckpt {} + swap {}", bytes_in_units(r.checkpoint_host_bytes),
                   bytes_in_units(r.optimizer_host_bytes)),
       10},
  };
  for (std::string& tier : tier_texts(tiers)) fields.push_back({std::move(tier), 4});  // they go together
  return fields;
}

std::string fit_progress_line(const std::vector<ProgressField>& fields, int columns) {
  const auto join = [&fields](int max_rank) {
    std::string line;
    for (const ProgressField& field : fields) {
      if (field.rank > max_rank) continue;
      if (!line.empty()) line += " | ";
      line += field.text;
    }
    return line;
  };
  int max_rank = 0;
  for (const ProgressField& field : fields) max_rank = std::max(max_rank, field.rank);
  for (; max_rank > 0; --max_rank) {
    std::string line = join(max_rank);  // not const: returned, it moves
    if (static_cast<int>(line.size()) <= columns) return line;
  }
  return join(0).substr(0, static_cast<size_t>(std::max(columns, 0)));
}

Progress::Progress(const std::string& metrics_path, bool interactive, int64_t log_every)
    : metrics_(metrics_path), interactive_(interactive), log_every_(log_every) {}

Progress::~Progress() {
  if (interactive_ && last_step_) {
    std::fputc('\n', stdout);
  }
}

void Progress::step(const train::StepRecord& r) {
  metrics_.step(r);
  last_step_ = r;
  if (interactive_) {
    draw();
  } else if (r.step % log_every_ == 0 || r.step == r.total_steps) {
    // The storage's saves have lines of their own; the memory tier's show here.
    std::string memory_tiers;
    for (const std::string& text : memory_tier_texts(metrics_.tiers())) memory_tiers += " " + text;
    fmt::print(
        "step {}/{} loss {:.4f} {:.0f} tok/s {:.0f} ms/step act-peak {} step-peak {} optim-resident {} grads {} "
        "host-ckpt {} host-optim {}{}\n",
        r.step, r.total_steps, r.loss, r.tokens_per_s, r.step_s * 1e3, bytes_in_units(r.peak_activation_bytes),
        bytes_in_units(r.peak_step_bytes), bytes_in_units(r.optimizer_resident_bytes), bytes_in_units(r.gradient_bytes),
        bytes_in_units(r.checkpoint_host_bytes), bytes_in_units(r.optimizer_host_bytes), memory_tiers);
    std::fflush(stdout);
  }
}

void Progress::memory_checkpoint(const dcp::MemorySaveReport& r) {
  metrics_.memory_checkpoint(r);
}

void Progress::memory_replication(const dcp::ReplicationReport& r) {
  metrics_.memory_replication(r);
}

void Progress::restore(const dcp::TierRestore& restored) {
  metrics_.restore(restored);
}

void Progress::checkpoint(const dcp::SaveReport& r) {
  metrics_.checkpoint(r);
  if (!r.committed) {
    warning(fmt::format("checkpoint step {} failed, training goes on: {}", r.step, r.error));
    return;
  }
  if (!r.error.empty()) warning(fmt::format("checkpoint step {} committed, but {}", r.step, r.error));
  if (interactive_) {
    draw();
  } else {
    fmt::print("checkpoint step {}: {} staged in {:.1f} ms, committed at {:.2f} GB/s -> {}\n", r.step,
               bytes_in_units(r.bytes), r.blocked_s * 1e3, train::committed_gbps(r), r.path);
    std::fflush(stdout);
  }
}

void Progress::end(const train::RunSummary& s) {
  metrics_.end(s);
  // Nothing trained (restore() said why), or preempted (the Trainer said so).
  if (s.first_step > s.last_step || s.exit_status == dist::kPreemptedStatus) return;
  message(fmt::format(
      "done: steps {}-{} in {:.3f} s, loss {:.3f} -> {:.3f}, peak activations {}, between steps: optimizer state "
      "{}, gradients {}; at peak: {} beyond the parameters",
      s.first_step, s.last_step, s.seconds, s.first_loss, s.last_loss, bytes_in_units(s.peak_activation_bytes),
      bytes_in_units(s.optimizer_resident_bytes), bytes_in_units(s.gradient_bytes), bytes_in_units(s.peak_step_bytes)));
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

void Progress::warning(const std::string& text) {
  if (interactive_ && last_step_) fmt::print("\r\033[2K");
  std::fflush(stdout);
  fmt::print(stderr, "{}\n", text);
  std::fflush(stderr);
  if (interactive_) draw();
}

void Progress::record(const std::string& json_object) {
  metrics_.record(json_object);
}

void Progress::draw() {
  if (!last_step_) return;
  // One column short of the width: a line that fills the last column leaves some
  // terminals' cursor on the next line.
  const std::string line = fit_progress_line(progress_fields(*last_step_, metrics_.tiers()), terminal_columns() - 1);
  fmt::print("\r\033[2K{}", line);
  std::fflush(stdout);
}

}  // namespace stowage::cli
