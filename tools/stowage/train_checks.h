#pragma once

// The checks of `stowage train`'s flags that depend on each other or on the machine, and
// the optimizer-state swap they describe.

#include "train_options.h"

#include <stowage/optim/swap_config.h>

#include <cstdint>
#include <string>

namespace stowage::cli {

// --swap-to disk:DIR's directory, or empty for host. Throws InvalidArgument naming the
// flag for anything else.
std::string swap_dir(const TrainOptions& options);

// The swap the flags describe (--swap-times, --swap-to, --swap-host-budget,
// --optimizer-update, --offload-fraction), which the run uses with --swap-times N > 0 or
// --optimizer-update host.
// REQUIRES: the flags parsed (--swap-host-budget a size); swap_dir(options) does not throw.
optim::SwapOptimizerConfig swap_config(const TrainOptions& options);

// The checks of flags that depend on each other or on the machine, made once, before
// any rank starts or anything is created: throws InvalidArgument naming the flags.
void check_train_options(const TrainOptions& options, int64_t world_size);

}  // namespace stowage::cli
