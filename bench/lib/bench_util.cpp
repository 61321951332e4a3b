#include "bench_util.h"

#include <stowage/error.h>

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <stdlib.h>

namespace stowage::bench {

void synchronize(c10::Device device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.index());
  } else if (!device.is_cpu()) {  // another accelerator: its current stream
    c10::impl::VirtualGuardImpl(device.type()).getStream(device).synchronize();
  }
}

double median(std::vector<double> values) {
  TORCH_CHECK(!values.empty(), "median of no values");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

RoundRobinStep clocked_step(const std::function<void()>& step, c10::Device device) {
  return {step, [step, device] { return seconds(step, device); }};
}

std::vector<double> median_seconds_in_rounds(const std::vector<RoundRobinStep>& configurations, int warmup_rounds,
                                             int timed_rounds) {
  for (int round = 0; round < warmup_rounds; ++round) {
    for (const RoundRobinStep& configuration : configurations) configuration.step();
  }
  std::vector<std::vector<double>> times(configurations.size());
  for (int round = 0; round < timed_rounds; ++round) {
    for (size_t i = 0; i < configurations.size(); ++i) times[i].push_back(configurations[i].timed_step());
  }
  std::vector<double> medians;
  medians.reserve(times.size());
  for (std::vector<double>& configuration_times : times) medians.push_back(median(std::move(configuration_times)));
  return medians;
}

std::string temp_directory() {
  const char* dir = std::getenv("TMPDIR");
  return dir != nullptr && *dir != '\0' ? dir : "/tmp";
}

Scratch::Scratch(const std::string& parent, const std::string& name) {
  const std::string base = parent.empty() ? temp_directory() : parent;
  std::string pattern = base + "/stowage-bench-" + name + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw Error(fmt::format("bench {}: cannot create a directory under '{}': {}", name, base, std::strerror(errno)));
  }
  path_ = pattern;
}

Scratch::~Scratch() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

void run_round(int round, const std::vector<std::function<void()>>& measurements) {
  const size_t n = measurements.size();
  const size_t i = static_cast<size_t>(round);
  for (size_t k = 0; k < n; ++k) measurements[(i % 2 == 0 ? i + k : i + n - k) % n]();
}

void take_turns(const std::vector<std::function<void()>>& measurements) {
  for (int i = 0; i < kRounds; ++i) run_round(i, measurements);
}

}  // namespace stowage::bench
