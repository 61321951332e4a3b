#pragma once

// The message of a caught exception, for embedding in one of stowage's own errors.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace stowage {

// A c10::Error's message without the C++ backtrace that LibTorch appends to what()
// (kilobytes of stack frames); any other exception's what().
inline std::string exception_message(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace stowage
