#pragma once

// The --device option of the stowage programs.

#include <c10/core/Device.h>

#include <string>

namespace stowage::cli {

// The device of a --device option ("cpu", "cuda", "cuda:1", "sim", "sim:1"). Throws
// InvalidArgument naming the text when it is no device, or one this build or machine does
// not have.
c10::Device parse_device(const std::string& text);

}  // namespace stowage::cli
