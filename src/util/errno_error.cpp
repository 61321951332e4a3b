#include "util/errno_error.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace stowage::util {

void throw_errno(const std::string& what, const std::string& path, const std::string& operation, int error_number) {
  const std::string message = fmt::format("{}: {}", what, std::strerror(error_number));
  if (error_number == ENOENT || error_number == ENOTDIR) throw NotFound(message, path, operation, error_number);
  throw IoError(message, path, operation, error_number);
}

}  // namespace stowage::util
