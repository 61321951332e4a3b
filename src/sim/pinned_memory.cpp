#include "sim/pinned_memory.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace stowage::sim::detail {
namespace {

constexpr size_t kAlignment = 4096;

std::mutex g_pinned_mutex;                    // guards g_pinned_blocks
std::map<uintptr_t, size_t> g_pinned_blocks;  // live pinned blocks: start -> size

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.erase(reinterpret_cast<uintptr_t>(data));
  }
  std::free(data);
}

}  // namespace

PinnedMemory& PinnedMemory::instance() {
  static auto* memory = new PinnedMemory();  // never destroyed: tensors outlive static destruction
  return *memory;
}

at::DataPtr PinnedMemory::allocate(size_t nbytes) {
  if (nbytes == 0) return {nullptr, c10::Device(c10::kCPU)};
  const size_t size = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, size);
  TORCH_CHECK_WITH(OutOfMemoryError, data != nullptr, fmt::format("sim: cannot pin {} bytes of host memory", nbytes));
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.emplace(reinterpret_cast<uintptr_t>(data), size);
  }
  return {data, data, &free_pinned, c10::Device(c10::kCPU)};
}

c10::DeleterFnPtr PinnedMemory::raw_deleter() const {
  return &free_pinned;
}

void PinnedMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

bool PinnedMemory::record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) {
  return true;
}

at::HostStats PinnedMemory::get_stats() {
  at::HostStats stats;
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  for (const auto& [start, size] : g_pinned_blocks) {
    stats.active_bytes.increase(size);
    stats.active_requests.increase(1);
  }
  return stats;
}

bool PinnedMemory::contains(const void* data) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned_blocks.upper_bound(address);
  if (it == g_pinned_blocks.begin()) return false;
  --it;
  return address < it->first + it->second;
}

}  // namespace stowage::sim::detail
