#pragma once

// Validators for the numeric options of the stowage commands. CLI11's Range,
// PositiveNumber and NonNegativeNumber answer both "abc" and "-1" with "Value … not in
// range 0.000000 to 179769313486231570…" (a 309-digit number); these say what is wrong
// in the option's own terms: "abc is not an integer", "-1 is below the minimum of 1".

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

namespace stowage::cli {

namespace detail {
// "" when `input` is a decimal integer in [min, max], else what is wrong with it.
std::string integer_problem(const std::string& input, long long min, unsigned long long max);
// "" when `input` is a finite number (strtod's syntax) greater than 0, else what is
// wrong with it.
std::string positive_number_problem(const std::string& input);
// "" when `input` is a finite number in [0, 1], else what is wrong with it.
std::string fraction_problem(const std::string& input);
}  // namespace detail

// A decimal integer in [min, max] that fits the option's type T.
template <typename T>
CLI::Validator integer_in(T min, T max = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T>, "integer_in is for integer options");
  // As CLI11's own validators describe themselves in --help.
  const bool unbounded = max == std::numeric_limits<T>::max();
  const std::string description = unbounded && min == 0   ? "NONNEGATIVE"
                                  : unbounded && min == 1 ? "POSITIVE"
                                  : unbounded             ? ">= " + std::to_string(min)
                                              : "[" + std::to_string(min) + " - " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max](std::string& input) {
        return detail::integer_problem(input, static_cast<long long>(min), static_cast<unsigned long long>(max));
      },
      description);
}

template <typename T>
CLI::Validator positive_integer() {
  return integer_in<T>(1);
}

template <typename T>
CLI::Validator non_negative_integer() {
  return integer_in<T>(0);
}

// A finite floating-point number > 0.
CLI::Validator positive_number();
// A finite number in [0, 1].
CLI::Validator fraction();

// A positive number of bytes as Hugging Face writes shard sizes: "5GB" (decimal units
// KB, MB, GB, TB), "512MiB" (binary units KiB, MiB, GiB, TiB), units in any case, or a
// plain count ("4096", "4096B"); nullopt for anything else, zero, or more than int64
// holds.
std::optional<int64_t> parse_byte_size(const std::string& input);
// Accepts what parse_byte_size parses.
CLI::Validator byte_size();
// What parse_byte_size parses, or "0" for none.
std::optional<int64_t> parse_byte_size_or_zero(const std::string& input);
CLI::Validator byte_size_or_zero();

// A duration of whole units, as Slurm and Kubernetes users write grace periods: "30s",
// "500ms", "2m", or a plain count of seconds ("30"); nullopt for anything else or past
// what milliseconds hold. Zero is a duration ("0s": none).
std::optional<std::chrono::milliseconds> parse_duration(const std::string& input);
// Accepts what parse_duration parses.
CLI::Validator duration();

// A signal by its name, with or without "SIG" (TERM, SIGUSR1, usr2), or its number;
// nullopt for an unknown one.
std::optional<int> parse_signal(const std::string& input);
// Accepts what parse_signal parses.
CLI::Validator signal_name();

}  // namespace stowage::cli
