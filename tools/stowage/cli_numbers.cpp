#include "cli_numbers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace stowage::cli {
namespace detail {

std::string integer_problem(const std::string& input, long long min, unsigned long long max) {
  const bool signed_input = !input.empty() && (input[0] == '-' || input[0] == '+');
  const auto digits = input.begin() + (signed_input ? 1 : 0);
  if (digits == input.end() || !std::all_of(digits, input.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return fmt::format("{} is not an integer", input);
  }
  unsigned long long magnitude = 0;
  const auto parsed = std::from_chars(input.data() + (digits - input.begin()), input.data() + input.size(), magnitude);
  const bool negative = input[0] == '-';
  // Not const: the returns below move them.
  std::string below = fmt::format("{} is below the minimum of {}", input, min);
  std::string above = fmt::format("{} is above the maximum of {}", input, max);
  if (parsed.ec == std::errc::result_out_of_range) {
    return negative ? below : above;
  }
  // Holds every value of min, max and magnitude, with either sign.
  const __int128 value = negative ? -static_cast<__int128>(magnitude) : static_cast<__int128>(magnitude);
  if (value < min) {
    return below;
  }
  if (value > static_cast<__int128>(max)) {
    return above;
  }
  return {};
}

std::string positive_number_problem(const std::string& input) {
  char* end = nullptr;
  // strtod skips leading white space, which CLI11 would not pass on to the option.
  const double value =
      input.empty() || std::isspace(static_cast<unsigned char>(input[0])) ? 0.0 : std::strtod(input.c_str(), &end);
  if (end == nullptr || end != input.c_str() + input.size()) {
    return fmt::format("{} is not a number", input);
  }
  if (!std::isfinite(value)) {
    return fmt::format("{} is not a finite number", input);
  }
  if (value <= 0) {
    return fmt::format("{} is not positive", input);
  }
  return {};
}

}  // namespace detail

CLI::Validator positive_number() {
  return CLI::Validator(detail::positive_number_problem, "POSITIVE");
}

}  // namespace stowage::cli
