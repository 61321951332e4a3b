#pragma once

// The tests' hand-written pickles and archives as string literals.

#include <cstddef>
#include <string>

namespace stowage::dcp::testing {

// The bytes of a literal, NULs included.
template <size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

}  // namespace stowage::dcp::testing
