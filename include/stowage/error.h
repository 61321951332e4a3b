#pragma once

#include <stdexcept>
#include <string>

namespace stowage {

// Every error stowage raises derives from Error, so callers can catch the library's
// failures apart from LibTorch's own c10::Error. Messages name the culprit (a key, a
// file, a rank) and say what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something the function cannot handle (a malformed state dict, a
// mismatched shape, an invalid option). Nothing was modified.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// An interface method that a subclass must provide was called on the base class.
class NotImplemented : public Error {
 public:
  using Error::Error;
};

}  // namespace stowage
