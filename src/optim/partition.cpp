#include <stowage/error.h>
#include <stowage/optim/partition.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

namespace stowage::optim {

std::vector<int64_t> partition_by_cost(const std::vector<int64_t>& costs, int64_t parts) {
  if (parts <= 0) {
    throw InvalidArgument(fmt::format("partition_by_cost: parts must be positive, got {}", parts));
  }
  const int64_t n = static_cast<int64_t>(costs.size());
  if (n == 0) return {};
  const int64_t batches = std::min(parts, n);
  int64_t remaining_cost = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int64_t b = 0; b + 1 < batches; ++b) {
    const int64_t batches_left = batches - b;
    // Compared in integers: |R - c*r| is r times the distance of c from the fair share R/r.
    auto distance = [&](int64_t cost) { return std::llabs(remaining_cost - cost * batches_left); };
    int64_t cost = costs[next];
    int64_t count = 1;
    const int64_t last_allowed = n - (batches_left - 1);  // leave one parameter per later batch
    while (next + count < last_allowed && distance(cost + costs[next + count]) < distance(cost)) {
      cost += costs[next + count];
      ++count;
    }
    sizes.push_back(count);
    next += count;
    remaining_cost -= cost;
  }
  sizes.push_back(n - next);
  return sizes;
}

}  // namespace stowage::optim
