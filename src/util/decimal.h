#pragma once

// The one reading of a non-negative decimal number that names carry: a parameter id in an
// optimizer state dict ("17"), the step of a checkpoint directory ("step-17").

#include <cstdint>
#include <optional>
#include <string>

namespace stowage {

// The value `text` spells with digits only, and few enough that it fits in an int64_t
// (no sign, space, or other spelling); nullopt for anything else.
inline std::optional<int64_t> parse_decimal_digits(const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(text);
}

}  // namespace stowage
