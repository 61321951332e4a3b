#pragma once

// Figures the reliability tests measure, appended as "name value" lines to the file
// named by STOWAGE_RELIABILITY_FIGURES (scripts/reliability_report.sh collects them
// into docs/reliability.md). Without the variable they only go to the test log.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace stowage::reliability {

inline void record_figure(const std::string& name, int64_t value) {
  std::printf("[figure] %s = %lld\n", name.c_str(), static_cast<long long>(value));
  const char* path = std::getenv("STOWAGE_RELIABILITY_FIGURES");
  if (path == nullptr || *path == '\0') return;
  if (std::FILE* out = std::fopen(path, "a")) {
    std::fprintf(out, "%s %lld\n", name.c_str(), static_cast<long long>(value));
    std::fclose(out);
  }
}

// A count from the environment (e.g. STOWAGE_CRASH_TRIALS), else `fallback`.
inline int64_t count_from_env(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? std::atoll(text) : fallback;
}

}  // namespace stowage::reliability
