#include "cli_numbers.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <utility>

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

namespace {

// "" with `value` set when `input` is a finite number (strtod's syntax), else what is
// wrong with it.
std::string finite_number_problem(const std::string& input, double& value) {
  char* end = nullptr;
  // strtod skips leading white space, which CLI11 would not pass on to the option.
  value = input.empty() || std::isspace(static_cast<unsigned char>(input[0])) ? 0.0 : std::strtod(input.c_str(), &end);
  if (end == nullptr || end != input.c_str() + input.size()) {
    return fmt::format("{} is not a number", input);
  }
  if (!std::isfinite(value)) {
    return fmt::format("{} is not a finite number", input);
  }
  return {};
}

}  // namespace

std::string positive_number_problem(const std::string& input) {
  double value = 0;
  std::string problem = finite_number_problem(input, value);
  if (problem.empty() && value <= 0) problem = fmt::format("{} is not positive", input);
  return problem;
}

std::string fraction_problem(const std::string& input) {
  double value = 0;
  std::string problem = finite_number_problem(input, value);
  if (problem.empty() && (value < 0 || value > 1)) problem = fmt::format("{} is not in [0, 1]", input);
  return problem;
}

}  // namespace detail

CLI::Validator positive_number() {
  return CLI::Validator(detail::positive_number_problem, "POSITIVE");
}

CLI::Validator fraction() {
  return CLI::Validator(detail::fraction_problem, "[0 - 1]");
}

namespace {

// "<decimal count><unit>" as count × the unit's multiplier (`no_unit` when there is no
// unit; unit names in upper case when `fold_case`); nullopt for an unknown unit, no
// digits, or a product past int64.
template <size_t N>
std::optional<int64_t> count_in_units(const std::string& input, const std::pair<const char*, int64_t> (&units)[N],
                                      bool fold_case, int64_t no_unit) {
  const auto digits_end = std::find_if(input.begin(), input.end(), [](unsigned char c) { return !std::isdigit(c); });
  std::string unit(digits_end, input.end());
  if (fold_case) {
    for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  int64_t multiplier = unit.empty() ? no_unit : 0;
  for (const auto& [name, value] : units) {
    if (unit == name) multiplier = value;
  }
  int64_t count = 0;
  const char* first = input.data();
  const char* last = input.data() + (digits_end - input.begin());
  const auto parsed = std::from_chars(first, last, count);
  if (multiplier == 0 || first == last || parsed.ec != std::errc() ||
      count > std::numeric_limits<int64_t>::max() / multiplier) {
    return std::nullopt;
  }
  return count * multiplier;
}

}  // namespace

std::optional<int64_t> parse_byte_size(const std::string& input) {
  static const std::pair<const char*, int64_t> kUnits[] = {{"KIB", int64_t(1) << 10},
                                                           {"MIB", int64_t(1) << 20},
                                                           {"GIB", int64_t(1) << 30},
                                                           {"TIB", int64_t(1) << 40},
                                                           {"KB", 1'000},
                                                           {"MB", 1'000'000},
                                                           {"GB", 1'000'000'000},
                                                           {"TB", 1'000'000'000'000},
                                                           {"B", 1}};
  // Units are read in any case, as huggingface_hub reads "5gb".
  const std::optional<int64_t> bytes = count_in_units(input, kUnits, /*fold_case=*/true, /*no_unit=*/1);
  if (bytes == 0) return std::nullopt;
  return bytes;
}

namespace {

// Accepts what `parse` parses; otherwise says "<input> is not <what>".
template <typename Parsed>
CLI::Validator accepting(Parsed (*parse)(const std::string&), const char* what, const char* name) {
  return CLI::Validator(
      [parse, what](std::string& input) {
        return parse(input) ? std::string() : fmt::format("{} is not {}", input, what);
      },
      name);
}

}  // namespace

CLI::Validator byte_size() {
  return accepting(parse_byte_size, "a positive size such as 5GB, 512MiB or 4096", "SIZE");
}

std::optional<int64_t> parse_byte_size_or_zero(const std::string& input) {
  return input == "0" ? std::optional<int64_t>(0) : parse_byte_size(input);
}

CLI::Validator byte_size_or_zero() {
  return accepting(parse_byte_size_or_zero, "0 or a size such as 5GB, 512MiB or 4096", "SIZE");
}

std::optional<std::chrono::milliseconds> parse_duration(const std::string& input) {
  static const std::pair<const char*, int64_t> kUnits[] = {{"ms", 1}, {"s", 1'000}, {"m", 60'000}, {"h", 3'600'000}};
  const std::optional<int64_t> milliseconds = count_in_units(input, kUnits, /*fold_case=*/false, /*no_unit=*/1'000);
  if (!milliseconds) return std::nullopt;
  return std::chrono::milliseconds(*milliseconds);
}

CLI::Validator duration() {
  return accepting(parse_duration, "a duration such as 30s, 500ms or 2m", "DURATION");
}

std::optional<int> parse_signal(const std::string& input) {
  static const std::pair<const char*, int> kSignals[] = {{"TERM", SIGTERM}, {"INT", SIGINT},   {"HUP", SIGHUP},
                                                         {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"QUIT", SIGQUIT},
                                                         {"XCPU", SIGXCPU}};
  std::string name = input;
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (const auto& [known, number] : kSignals) {
    if (name == known) return number;
  }
  int number = 0;
  const auto parsed = std::from_chars(name.data(), name.data() + name.size(), number);
  if (parsed.ec == std::errc() && parsed.ptr == name.data() + name.size()) {
    for (const auto& [known, known_number] : kSignals) {
      if (number == known_number) return number;
    }
  }
  return std::nullopt;
}

CLI::Validator signal_name() {
  return accepting(parse_signal, "a signal a scheduler sends: TERM, INT, HUP, USR1, USR2, QUIT or XCPU", "SIGNAL");
}

}  // namespace stowage::cli
