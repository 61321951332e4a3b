#pragma once

// The one place an errno becomes a stowage error (LevelDB's PosixError).

#include <string>

namespace stowage::util {

// Throws NotFound for ENOENT and ENOTDIR, IoError for any other errno: of `operation` on
// `path` (empty for a call on no file), with the message "<what>: <strerror(error_number)>".
[[noreturn]] void throw_errno(const std::string& what, const std::string& path, const std::string& operation,
                              int error_number);

}  // namespace stowage::util
