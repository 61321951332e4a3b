#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

namespace stowage::memory {
namespace {

TEST(Accounting, CountsAKnownAllocationAndItsRelease) {
  enable_accounting();
  const int64_t before = memory_allocated();
  reset_peak_memory_stats();
  {
    auto t = torch::empty({1024, 1024}, torch::kFloat);  // 4 MiB
    EXPECT_EQ(memory_allocated() - before, 4 << 20);
  }
  EXPECT_EQ(memory_allocated(), before);
  EXPECT_GE(max_memory_allocated() - before, 4 << 20);
  reset_peak_memory_stats();
  EXPECT_EQ(max_memory_allocated(), memory_allocated());
}

TEST(Accounting, PeakTracksTheHighestPointAcrossThreads) {
  enable_accounting();
  reset_peak_memory_stats();
  const int64_t base = memory_allocated();
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([] {
      for (int j = 0; j < 50; ++j) {
        auto t = torch::ones({256, 256});
        (void)t.sum();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(memory_allocated(), base);
  EXPECT_GE(max_memory_allocated() - base, 256 * 256 * 4);
}

TEST(Accounting, CachedBlocksAreReusedWithinTheLimitAndNotCountedAsAllocated) {
  enable_accounting();
  set_cpu_cache_limit(6 << 20);
  const int64_t before = memory_allocated();
  const int64_t cached_before = memory_stats().cached_bytes;
  void* first = nullptr;
  {
    auto a = torch::empty({1 << 20}, torch::kFloat);
    auto b = torch::empty({1 << 20}, torch::kFloat);
    first = a.data_ptr();
    a = torch::Tensor();  // 4 MiB: cached
  }                       // b: 4 MiB more would pass the limit, released
  EXPECT_EQ(memory_allocated(), before);
  EXPECT_EQ(memory_stats().cached_bytes - cached_before, 4 << 20);
  {
    auto again = torch::empty({1 << 20}, torch::kFloat);
    EXPECT_EQ(again.data_ptr(), first);  // the cached block, taken again
    EXPECT_EQ(memory_allocated() - before, 4 << 20);
    EXPECT_EQ(memory_stats().cached_bytes, cached_before);
    auto other_size = torch::empty({(1 << 20) + 16}, torch::kFloat);
    EXPECT_NE(other_size.data_ptr(), first);
  }
  empty_cpu_cache();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  set_cpu_cache_limit(0);
  { auto released = torch::empty({1 << 20}, torch::kFloat); }
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  EXPECT_THROW(set_cpu_cache_limit(-1), InvalidArgument);
}

TEST(Accounting, AScopedCacheLimitPutsBackTheLimitBefore) {
  enable_accounting();
  set_cpu_cache_limit(0);
  {
    const ScopedCpuCacheLimit scoped(4 << 20);
    { auto released = torch::empty({1 << 18}, torch::kFloat); }  // 1 MiB: cached
    EXPECT_EQ(memory_stats().cached_bytes, 1 << 20);
  }
  EXPECT_EQ(memory_stats().cached_bytes, 0);  // the limit from before, 0, released it
  { auto released = torch::empty({1 << 18}, torch::kFloat); }
  EXPECT_EQ(memory_stats().cached_bytes, 0);
  EXPECT_THROW(ScopedCpuCacheLimit(-1), InvalidArgument);
}

TEST(HostBuffer, ExactSizeAndCountedApartFromTheAllocator) {
  enable_accounting();
  const int64_t allocator_before = memory_allocated();
  const int64_t host_before = host_buffer_stats().current_bytes;
  {
    auto t = allocate_host({1000, 1000}, torch::kFloat);
    t.fill_(2);
    EXPECT_EQ(t.sum().item<double>(), 2e6);
    const int64_t page = sysconf(_SC_PAGESIZE);
    const int64_t expected = (4'000'000 + page - 1) / page * page;  // page-rounded, not a power of two
    EXPECT_EQ(host_buffer_stats().current_bytes - host_before, expected);
    EXPECT_EQ(memory_allocated(), allocator_before);
  }
  EXPECT_EQ(host_buffer_stats().current_bytes, host_before);
}

TEST(HostBuffer, UnavailableDeviceAccountingIsAClearError) {
  EXPECT_THROW(memory_stats(c10::Device(c10::kXLA, 0)), std::exception);
}

}  // namespace
}  // namespace stowage::memory
