#pragma once

// The checks of `stowage train`'s flags that depend on each other or on the machine.

#include "train_options.h"

#include <cstdint>
#include <string>

namespace stowage::cli {

// --swap-to disk:DIR's directory, or empty for host. Throws InvalidArgument naming the
// flag for anything else.
std::string swap_dir(const TrainOptions& options);

// The checks of flags that depend on each other or on the machine, made once, before
// any rank starts or anything is created: throws InvalidArgument naming the flags.
void check_train_options(const TrainOptions& options, int64_t world_size);

}  // namespace stowage::cli
