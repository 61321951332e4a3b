#pragma once

// How the swap optimizer splits its parameters into pipeline batches.

#include <cstdint>
#include <vector>

namespace stowage::optim {

// Splits `costs` (one per parameter, in order) into at most `parts` contiguous, non-empty
// batches of similar total cost and returns the number of parameters in each batch.
// Each batch but the last grows while that brings its cost closer to the remaining
// cost's fair share (remaining cost / remaining batches), and always leaves at least one
// parameter for each later batch; the last batch takes the rest.
// Example: costs {16,16,16,16,16,1,16,16,4,2,4,2} into 4 parts cost {32,32,33,28}.
std::vector<int64_t> partition_by_cost(const std::vector<int64_t>& costs, int64_t parts);

}  // namespace stowage::optim
