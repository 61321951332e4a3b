#pragma once

// A count of bytes as text, the one way stowage and its programs write one: the short form
// for tables and progress lines, the exact form for messages that name a budget or a size
// the reader may need to the byte. Header-only, so that every module and target includes
// it (the simulated device's library, stowage::sim, links nothing of stowage).

#include <cstdint>
#include <cmath>
#include <string>

namespace stowage {

// "384.0 MiB", "512 B": in the largest binary unit (up to TiB) the count reaches, to one
// decimal; below a KiB, in bytes.
inline std::string bytes_in_units(int64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  constexpr int kLastUnit = 4;
  auto value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < kLastUnit) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  // Tenths in whole numbers rather than printf's %.1f, whose decimal point is the locale's.
  const int64_t tenths = std::llround(value * 10);
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " " + kUnits[unit];
}

// "402653184 bytes (384.0 MiB)", "512 bytes": the exact count, and bytes_in_units where
// that says more.
inline std::string bytes_exactly(int64_t bytes) {
  const std::string exact = std::to_string(bytes) + " bytes";
  return bytes < 1024 ? exact : exact + " (" + bytes_in_units(bytes) + ")";
}

}  // namespace stowage
