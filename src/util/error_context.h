#pragma once

#include <string>

namespace stowage::util {

// Rethrows the exception in flight (a stowage Error) with `context` before its message,
// keeping its type and fields; a CorruptionError without an entry gets `entry`.
// REQUIRES: called inside a catch block.
[[noreturn]] void rethrow_in_context(const std::string& context, const std::string& entry);

}  // namespace stowage::util
