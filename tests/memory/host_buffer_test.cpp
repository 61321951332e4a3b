// allocate_host_tensors: many tensors from a few arenas, each aligned, each freed with
// the last tensor of its arena; host_buffer_stats counts the buffers by use.

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace stowage::memory {
namespace {

int64_t page() {
  return static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

TEST(HostArena, SmallTensorsShareOneArenaEachAlignedAndSeparate) {
  const int64_t before = host_buffer_stats().current_bytes;
  std::vector<HostTensorSpec> specs;
  specs.reserve(1000);
  for (int i = 0; i < 1000; ++i) specs.push_back({{i % 7, 3}, i % 2 == 0 ? c10::kFloat : c10::kComplexDouble});
  const std::vector<at::Tensor> tensors = allocate_host_tensors(specs, HostAllocOptions{}, int64_t(1) << 20);
  ASSERT_EQ(tensors.size(), specs.size());
  int64_t packed = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    EXPECT_EQ(t.sizes().vec(), specs[i].sizes);
    EXPECT_EQ(t.scalar_type(), specs[i].dtype);
    EXPECT_TRUE(t.is_cpu() && t.is_contiguous());
    EXPECT_TRUE(t.storage().is_alias_of(tensors[0].storage())) << i;  // one arena
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % kHostArenaAlignment, 0u) << i;
    packed = (packed + kHostArenaAlignment - 1) / kHostArenaAlignment * kHostArenaAlignment + int64_t(t.nbytes());
  }
  // No page per tensor: the arena is the packed bytes, rounded up to a page once.
  EXPECT_EQ(host_buffer_stats().current_bytes - before, (packed + page() - 1) / page() * page());
  // Writing one tensor changes no other.
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].fill_(static_cast<double>(i));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].numel() > 0) EXPECT_EQ(at::real(tensors[i]).min().item<double>(), double(i)) << i;
  }
}

TEST(HostArena, ArenasAreCappedAndFreedWithTheirLastTensor) {
  const int64_t before = host_buffer_stats().current_bytes;
  constexpr int64_t kCap = 64 * 1024;
  // 3 tensors of 24 KiB fit two to an arena; one of 100 KiB gets its own.
  std::vector<HostTensorSpec> specs = {
      {{6 * 1024}, c10::kFloat}, {{6 * 1024}, c10::kFloat}, {{6 * 1024}, c10::kFloat}, {{25 * 1024}, c10::kFloat}};
  std::vector<at::Tensor> tensors = allocate_host_tensors(specs, HostAllocOptions{}, kCap);
  EXPECT_TRUE(tensors[0].storage().is_alias_of(tensors[1].storage()));
  EXPECT_FALSE(tensors[1].storage().is_alias_of(tensors[2].storage()));
  EXPECT_FALSE(tensors[2].storage().is_alias_of(tensors[3].storage()));
  EXPECT_EQ(host_buffer_stats().current_bytes - before, 48 * 1024 + 24 * 1024 + 100 * 1024);
  tensors[0].reset();  // its arena stays: tensors[1] is in it
  EXPECT_EQ(host_buffer_stats().current_bytes - before, 48 * 1024 + 24 * 1024 + 100 * 1024);
  at::Tensor view = tensors[1].slice(0, 0, 1);
  tensors[1].reset();  // a view keeps the arena too
  EXPECT_EQ(host_buffer_stats().current_bytes - before, 48 * 1024 + 24 * 1024 + 100 * 1024);
  view.reset();
  EXPECT_EQ(host_buffer_stats().current_bytes - before, 24 * 1024 + 100 * 1024);
  tensors.clear();
  EXPECT_EQ(host_buffer_stats().current_bytes, before);
}

TEST(HostBufferStats, BuffersAreCountedByUseUntilFreed) {
  const HostBufferStats before = host_buffer_stats();
  HostAllocOptions checkpoint;
  checkpoint.use = HostBufferUse::kCheckpoint;
  HostAllocOptions optimizer;
  optimizer.use = HostBufferUse::kOptimizer;
  at::Tensor staged = allocate_host({page()}, c10::kByte, checkpoint);
  std::vector<at::Tensor> swapped = allocate_host_tensors({{{3}, c10::kFloat}, {{5}, c10::kFloat}}, optimizer, page());
  at::Tensor other = allocate_host({2 * page()}, c10::kByte);
  HostBufferStats now = host_buffer_stats();
  EXPECT_EQ(now.checkpoint_bytes - before.checkpoint_bytes, page());
  EXPECT_EQ(now.optimizer_bytes - before.optimizer_bytes, page());  // one arena
  EXPECT_EQ(now.current_bytes - before.current_bytes, 4 * page());
  staged.reset();
  swapped.clear();
  now = host_buffer_stats();
  EXPECT_EQ(now.checkpoint_bytes, before.checkpoint_bytes);
  EXPECT_EQ(now.optimizer_bytes, before.optimizer_bytes);
  EXPECT_EQ(now.current_bytes - before.current_bytes, 2 * page());
}

TEST(HostArena, SharedArenasUseOneDescriptorEach) {
  const int64_t before = host_buffer_stats().shared_bytes;
  std::vector<HostTensorSpec> specs(5000, HostTensorSpec{{16}, c10::kFloat});
  const std::vector<at::Tensor> tensors = allocate_host_tensors(specs, HostAllocOptions{false, true}, int64_t(1) << 30);
  EXPECT_TRUE(tensors.front().storage().is_alias_of(tensors.back().storage()));
  EXPECT_EQ(host_buffer_stats().shared_bytes - before, (5000 * 64 + page() - 1) / page() * page());
}

TEST(HostArena, ANegativeSizeIsRejected) {
  EXPECT_THROW(allocate_host_tensors({{{2, -1}, c10::kFloat}}, HostAllocOptions{}, 4096), InvalidArgument);
  EXPECT_TRUE(allocate_host_tensors({}, HostAllocOptions{}, 4096).empty());
}

}  // namespace
}  // namespace stowage::memory
