#include <stowage/memory/skipped_sync.h>

#include <atomic>

namespace stowage::memory {
namespace {

std::atomic<SkippedSync> g_skipped{SkippedSync::kNone};

}  // namespace

void skip_sync_for_testing(SkippedSync sync) {
  g_skipped.store(sync);
}

bool sync_skipped(SkippedSync sync) {
  return sync != SkippedSync::kNone && g_skipped.load(std::memory_order_relaxed) == sync;
}

}  // namespace stowage::memory
