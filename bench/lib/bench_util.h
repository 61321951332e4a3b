#pragma once

// Small helpers shared by the benchmarks.

#include <c10/core/Device.h>

#include <chrono>
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

// The system temporary directory ($TMPDIR, else /tmp).
std::string temp_directory();

}  // namespace stowage::bench
