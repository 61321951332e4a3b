#include "sim/device_memory.h"

#include "sim/runtime.h"
#include "sim/stream_queue.h"

#include <stowage/byte_count.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace stowage::sim::detail {

struct Block {
  void* data = nullptr;
  size_t size = 0;  // rounded, as accounted
  c10::DeviceIndex device = 0;
  std::vector<c10::Stream> used_on;  // the allocation stream, then those recordStream named
  struct Copy {
    c10::StreamId stream;
    Access access;
    bool running;
  };
  std::vector<Copy> unfinished;  // copies queued or running on it; guarded by g_access_mutex
};

namespace {

constexpr size_t kRounding = 512;  // CUDA's caching allocator rounds to 512 bytes too

struct PendingFree {
  Block* block;
  std::vector<std::shared_ptr<Marker>> drained;  // one per stream the block was used on
};

struct DeviceState {
  std::mutex mutex;  // guards everything below
  int64_t pending_bytes = 0;
  int64_t cached_bytes = 0;
  std::vector<PendingFree> pending;
  std::map<size_t, std::vector<Block*>> cache;  // by size
  c10::CachingDeviceAllocator::DeviceStats stats;
};

std::array<DeviceState, kMaxDevices>& states() {
  static auto* all = new std::array<DeviceState, kMaxDevices>();  // never destroyed, like the streams
  return *all;
}

std::mutex g_access_mutex;  // guards every Block's queued_reads and queued_writes

int64_t reserved(const DeviceState& state) {
  return state.stats.allocated_bytes[0].current + state.pending_bytes + state.cached_bytes;
}

// Moves the pending blocks whose streams have drained into the cache, poisoned.
// REQUIRES: state.mutex held.
void collect_pending(DeviceState& state) {
  auto drained = [](const PendingFree& free) {
    return std::all_of(free.drained.begin(), free.drained.end(), [](const auto& marker) { return marker->done(); });
  };
  for (auto it = state.pending.begin(); it != state.pending.end();) {
    if (!drained(*it)) {
      ++it;
      continue;
    }
    Block* block = it->block;
    std::memset(block->data, kPoison, block->size);
    state.pending_bytes -= static_cast<int64_t>(block->size);
    state.cached_bytes += static_cast<int64_t>(block->size);
    state.cache[block->size].push_back(block);
    it = state.pending.erase(it);
  }
}

// REQUIRES: state.mutex held, and no queued copy of the device's streams can still touch
// a cached block (the streams were synchronized since those blocks were cached).
void release_cache(DeviceState& state) {
  for (auto& [size, blocks] : state.cache) {
    for (Block* block : blocks) {
      std::free(block->data);
      delete block;
      state.stats.segment[0].decrease(1);
    }
  }
  state.cache.clear();
  state.cached_bytes = 0;
}

void free_block(void* context) {
  auto* block = static_cast<Block*>(context);
  DeviceState& state = states()[static_cast<size_t>(block->device)];
  std::lock_guard<std::mutex> lock(state.mutex);
  state.stats.allocated_bytes[0].decrease(block->size);
  state.stats.active_bytes[0].decrease(block->size);
  state.stats.allocation[0].decrease(1);
  state.stats.active[0].decrease(1);
  PendingFree free{block, {}};
  for (const c10::Stream& stream : block->used_on) {
    StreamQueue& queue = queue_of(stream);
    if (!queue.idle()) free.drained.push_back(queue.record());
  }
  block->used_on.clear();
  state.pending_bytes += static_cast<int64_t>(block->size);
  state.pending.push_back(std::move(free));
  collect_pending(state);
}

[[noreturn]] void out_of_memory(DeviceState& state, c10::DeviceIndex device, size_t nbytes) {
  ++state.stats.num_ooms;
  const int64_t capacity = capacity_of(device);
  const int64_t allocated = state.stats.allocated_bytes[0].current;
  const int64_t free = std::max<int64_t>(0, capacity - reserved(state));
  TORCH_CHECK_WITH(OutOfMemoryError, false,
                   fmt::format("sim:{} is out of memory: tried to allocate {}; the device holds {}, of which {} are "
                               "allocated and {} are free",
                               device, bytes_exactly(static_cast<int64_t>(nbytes)), bytes_exactly(capacity),
                               bytes_exactly(allocated), bytes_exactly(free)));
}

}  // namespace

DeviceMemory& DeviceMemory::instance() {
  static auto* memory = new DeviceMemory();  // never destroyed: tensors outlive static destruction
  return *memory;
}

c10::DataPtr DeviceMemory::allocate(size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  const c10::Device where = sim_device(device);
  if (nbytes == 0) return {nullptr, where};
  const size_t size = (nbytes + kRounding - 1) / kRounding * kRounding;
  DeviceState& state = states()[static_cast<size_t>(device)];
  std::unique_lock<std::mutex> lock(state.mutex);
  collect_pending(state);
  Block* block = nullptr;
  auto cached = state.cache.find(size);
  if (cached != state.cache.end() && !cached->second.empty()) {
    block = cached->second.back();
    cached->second.pop_back();
    state.cached_bytes -= static_cast<int64_t>(size);
  } else {
    if (reserved(state) + static_cast<int64_t>(size) > capacity_of(device)) {
      // As CUDA's allocator does before it gives up: wait for the streams, free the cache.
      lock.unlock();
      synchronize_device(device);
      lock.lock();
      collect_pending(state);
      release_cache(state);
      if (reserved(state) + static_cast<int64_t>(size) > capacity_of(device)) out_of_memory(state, device, nbytes);
    }
    void* data = std::aligned_alloc(kRounding, size);
    if (data == nullptr) out_of_memory(state, device, nbytes);
    block = new Block{data, size, device, {}, {}};
    state.stats.segment[0].increase(1);
  }
  block->used_on.push_back(current_stream(device));
  state.stats.allocated_bytes[0].increase(size);
  state.stats.active_bytes[0].increase(size);
  state.stats.allocation[0].increase(1);
  state.stats.active[0].increase(1);
  const int64_t now_reserved = reserved(state);
  auto& reserved_stat = state.stats.reserved_bytes[0];
  reserved_stat.current = now_reserved;
  reserved_stat.peak = std::max(reserved_stat.peak, now_reserved);
  return {block->data, block, &free_block, where};
}

c10::DeleterFnPtr DeviceMemory::raw_deleter() const {
  return nullptr;  // a block is freed through its context, not its address
}

void DeviceMemory::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

void DeviceMemory::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  for (c10::DeviceIndex device = 0; device < device_count(); ++device) {
    synchronize_device(device);
    DeviceState& state = states()[static_cast<size_t>(device)];
    std::lock_guard<std::mutex> lock(state.mutex);
    collect_pending(state);
    release_cache(state);
  }
}

void DeviceMemory::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get_deleter() != &free_block) return;  // not a block of ours (e.g. empty)
  auto* block = static_cast<Block*>(ptr.get_context());
  std::lock_guard<std::mutex> lock(states()[static_cast<size_t>(block->device)].mutex);
  if (std::find(block->used_on.begin(), block->used_on.end(), stream) == block->used_on.end()) {
    block->used_on.push_back(stream);
  }
}

c10::CachingDeviceAllocator::DeviceStats DeviceMemory::getDeviceStats(c10::DeviceIndex device) {
  check_index(device);
  DeviceState& state = states()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(state.mutex);
  c10::CachingDeviceAllocator::DeviceStats stats = state.stats;
  stats.reserved_bytes[0].current = reserved(state);
  return stats;
}

void DeviceMemory::resetAccumulatedStats(c10::DeviceIndex device) {
  check_index(device);
  DeviceState& state = states()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(state.mutex);
  for (auto* stat : {&state.stats.allocated_bytes[0], &state.stats.active_bytes[0], &state.stats.allocation[0],
                     &state.stats.active[0], &state.stats.segment[0], &state.stats.reserved_bytes[0]}) {
    stat->reset_accumulated();
  }
  state.stats.num_ooms = 0;
}

void DeviceMemory::resetPeakStats(c10::DeviceIndex device) {
  check_index(device);
  DeviceState& state = states()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(state.mutex);
  for (auto* stat : {&state.stats.allocated_bytes[0], &state.stats.active_bytes[0], &state.stats.allocation[0],
                     &state.stats.active[0], &state.stats.segment[0]}) {
    stat->reset_peak();
  }
  state.stats.reserved_bytes[0].peak = reserved(state);
}

std::pair<size_t, size_t> DeviceMemory::getMemoryInfo(c10::DeviceIndex device) {
  check_index(device);
  DeviceState& state = states()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(state.mutex);
  const int64_t capacity = capacity_of(device);
  return {static_cast<size_t>(std::max<int64_t>(0, capacity - reserved(state))), static_cast<size_t>(capacity)};
}

// ------------------------------------------------------------ access tracking

Block* block_of(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return nullptr;
  const c10::DataPtr& data = tensor.storage().data_ptr();
  if (data.get_deleter() != &free_block) return nullptr;
  return static_cast<Block*>(data.get_context());
}

void copy_queued(Block* block, const c10::Stream& stream, Access access) {
  std::lock_guard<std::mutex> lock(g_access_mutex);
  block->unfinished.push_back({stream.id(), access, false});
}

void copy_running(Block* block, const c10::Stream& stream, Access access) {
  std::lock_guard<std::mutex> lock(g_access_mutex);
  for (Block::Copy& copy : block->unfinished) {
    if (copy.stream == stream.id() && copy.access == access && !copy.running) {
      copy.running = true;
      return;
    }
  }
}

void copy_finished(Block* block, const c10::Stream& stream, Access access) {
  std::lock_guard<std::mutex> lock(g_access_mutex);
  auto& copies = block->unfinished;
  for (auto it = copies.begin(); it != copies.end(); ++it) {
    if (it->stream == stream.id() && it->access == access && it->running) {
      copies.erase(it);
      return;
    }
  }
}

std::string find_conflict(Block* block, const c10::Stream& stream, Access access, Rival rival,
                          const std::string& what) {
  std::lock_guard<std::mutex> lock(g_access_mutex);
  for (const Block::Copy& copy : block->unfinished) {
    if (copy.stream == stream.id() || (rival == Rival::kRunning && !copy.running)) continue;
    // Reads conflict with writes; a write conflicts with both.
    if (access == Access::kRead && copy.access == Access::kRead) continue;
    return fmt::format(
        "sim: hazard on sim:{}: {} on stream {} {} memory that a copy {} on stream {} is still {}; order the two "
        "(wait_stream, an event, or synchronize) before {}",
        block->device, what, stream.id(), access == Access::kRead ? "reads" : "writes",
        copy.running ? "running" : "queued", copy.stream, copy.access == Access::kWrite ? "writing" : "reading",
        access == Access::kRead ? "reading it" : "overwriting it");
  }
  return {};
}

}  // namespace stowage::sim::detail
