#pragma once

// Small helpers shared by the benchmarks.

#include <chrono>
#include <string>

namespace stowage::bench {

// Seconds elapsed while running `fn` once.
template <typename Fn>
double seconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The system temporary directory ($TMPDIR, else /tmp).
std::string temp_directory();

}  // namespace stowage::bench
