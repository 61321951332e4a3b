#pragma once

// Small helpers shared by the benchmarks.

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stowage::bench {

// Blocks until the work queued on `device` has run (nothing to wait for on the CPU).
void synchronize(c10::Device device);

// Seconds elapsed while running `fn` once, and the work it queued on `device`.
template <typename Fn>
double seconds(Fn&& fn, c10::Device device = c10::kCPU) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The median of `values` (the mean of the middle two for an even count); not empty.
double median(std::vector<double> values);

// One configuration of a benchmark that steps several side by side (median_seconds_in_rounds).
struct RoundRobinStep {
  std::function<void()> step;          // untimed, to warm up
  std::function<double()> timed_step;  // its seconds (it may measure more around them)
};

// A configuration whose timed step is `step` under seconds() on `device`.
RoundRobinStep clocked_step(const std::function<void()>& step, c10::Device device);

// Steps every configuration once a round, in order, `warmup_rounds` rounds untimed and then
// `timed_rounds` timed, so that each configuration meets the same machine state (the same
// other load, the same malloc heap): the median seconds of each configuration's timed steps.
std::vector<double> median_seconds_in_rounds(const std::vector<RoundRobinStep>& configurations, int warmup_rounds,
                                             int timed_rounds);

// The system temporary directory ($TMPDIR, else /tmp).
std::string temp_directory();

// GB/s (10^9 bytes a second).
inline double gbps(int64_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

// A fresh directory "stowage-bench-<name>-XXXXXX" under `parent` (empty: the temporary
// directory), removed with everything in it, also on an exception.
class Scratch {
 public:
  Scratch(const std::string& parent, const std::string& name);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The process's RSS high-water mark (VmHWM) starts again from its current RSS
// (writes "5" to /proc/self/clear_refs).
void reset_peak_rss();

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); 0 when absent.
int64_t status_bytes(const std::string& field);

// How many rounds take_turns runs.
inline constexpr int kRounds = 7;

// Round `round` of take_turns: each measurement once, in an order that rotates with the
// round and runs backwards in odd rounds.
void run_round(int round, const std::vector<std::function<void()>>& measurements);

// Runs the measurements kRounds times in turns: each round starts with the next one and
// odd rounds run backwards, so that none always comes first or follows the same one
// (two swap places every round).
void take_turns(const std::vector<std::function<void()>>& measurements);

}  // namespace stowage::bench
