// Tests that need a CUDA device: pinned staging, copies on their own streams overlapping
// compute (measured from the device's own timeline, recorded by LibTorch's Kineto/CUPTI
// profiler), and the swap optimizer's pipeline. Each one skips, with the reason, without
// a CUDA build or a visible GPU. (The seed suites, DcpSeed000 and the activation seeds,
// run on the build's device, testing::test_device(): CUDA tensors on a GPU machine, the
// simulated device's in any other build against LibTorch 2.x; tests/sim runs stowage's
// device paths on the simulated device.)
#include <stowage/build_info.h>

#include <gtest/gtest.h>

#if defined(STOWAGE_WITH_CUDA)
#include "cli/train_util.h"

#include <stowage/dcp/staging.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/optim/swap_optimizer.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>
#endif

namespace {

// GTEST_SKIP only returns from the test body itself, hence a macro.
#define SKIP_WITHOUT_A_GPU()                                                              \
  if (!stowage::build_info().with_cuda) GTEST_SKIP() << "stowage was built without CUDA"; \
  if (stowage::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible"

#if !defined(STOWAGE_WITH_CUDA)

TEST(Device, NeedsACudaBuild) {
  SKIP_WITHOUT_A_GPU();
}

#else

const c10::Device kCuda(c10::kCUDA, 0);

// What the device ran, from CUPTI's activity records: kernels and memory copies, with the
// stream each ran on and its device-clock start and end.
struct DeviceActivity {
  std::string name;
  int64_t stream = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  bool is_copy(const std::string& direction) const { return name.find("Memcpy " + direction) != std::string::npos; }
  bool is_kernel() const {
    return name.find("Memcpy") == std::string::npos && name.find("Memset") == std::string::npos;
  }
};

std::vector<DeviceActivity> device_timeline(const std::function<void()>& work) {
  namespace profiler = torch::profiler::impl;
  const std::set<profiler::ActivityType> activities{profiler::ActivityType::CPU, profiler::ActivityType::CUDA};
  torch::autograd::profiler::prepareProfiler(profiler::ProfilerConfig(profiler::ProfilerState::KINETO), activities);
  torch::autograd::profiler::enableProfiler(profiler::ProfilerConfig(profiler::ProfilerState::KINETO), activities);
  work();
  cudaDeviceSynchronize();
  const auto result = torch::autograd::profiler::disableProfiler();
  std::vector<DeviceActivity> timeline;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::kCUDA) continue;
    timeline.push_back({event.name(), event.deviceResourceId(), event.startNs(), event.endNs()});
  }
  return timeline;
}

bool overlap(const DeviceActivity& a, const DeviceActivity& b) {
  return a.start_ns < b.end_ns && b.start_ns < a.end_ns;
}

// Whether some activity matching `first` ran at the same time as one matching `second`
// on another stream.
bool ran_concurrently(const std::vector<DeviceActivity>& timeline,
                      const std::function<bool(const DeviceActivity&)>& first,
                      const std::function<bool(const DeviceActivity&)>& second) {
  for (const auto& a : timeline) {
    if (!first(a)) continue;
    for (const auto& b : timeline) {
      if (second(b) && a.stream != b.stream && overlap(a, b)) return true;
    }
  }
  return false;
}

std::string describe(const std::vector<DeviceActivity>& timeline) {
  std::string text;
  for (const auto& a : timeline) {
    text += a.name.substr(0, 60) + " stream " + std::to_string(a.stream) + " [" + std::to_string(a.start_ns) + ", " +
            std::to_string(a.end_ns) + "]\n";
  }
  return text;
}

// A device-bound chain of matrix products, long against a copy of a few MiB.
void busy_compute(int64_t rounds) {
  at::Tensor a = torch::randn({2048, 2048}, at::TensorOptions().device(kCuda));
  for (int64_t i = 0; i < rounds; ++i) a = torch::tanh(torch::mm(a, a));
}

TEST(Device, StagingBuffersArePinnedAtTheirExactSize) {
  SKIP_WITHOUT_A_GPU();
  stowage::StateDict state;
  int64_t total = 0;
  for (int64_t numel : {1, 1000, 4097, 1 << 20}) {
    state.insert("t" + std::to_string(numel), torch::randn({numel}, at::TensorOptions().device(kCuda)));
    total += numel * 4;
  }
  const int64_t pinned_before = stowage::memory::host_buffer_stats().pinned_bytes;
  stowage::dcp::DefaultStager stager(stowage::dcp::StagingOptions().use_async_staging(false));
  const stowage::StateDict staged = stager.stage(stowage::dcp::SaveableState(state)).state_dict();
  for (const auto& item : staged) {
    const at::Tensor& tensor = item.value().toTensor();
    EXPECT_TRUE(tensor.is_cpu()) << item.key();
    EXPECT_TRUE(stowage::memory::is_pinned(tensor)) << item.key();
    EXPECT_TRUE(torch::equal(tensor, state.at(item.key()).toTensor().cpu())) << item.key();
  }
  // Pinned as they are, not rounded up to a power of two as LibTorch's host allocator
  // would: at most a page of rounding per buffer.
  const int64_t pinned = stowage::memory::host_buffer_stats().pinned_bytes - pinned_before;
  EXPECT_GE(pinned, total);
  EXPECT_LE(pinned, total + 4 * 4096);
}

TEST(Device, DefaultStagerCopiesOnItsOwnStreamWhileComputeRuns) {
  SKIP_WITHOUT_A_GPU();
  stowage::StateDict state;
  state.insert("w", torch::randn({64 << 20 >> 2}, at::TensorOptions().device(kCuda)));
  stowage::dcp::DefaultStager stager;
  stager.stage(stowage::dcp::SaveableState(state));  // warm: the pinned buffers exist, the copy is all that is left
  const auto timeline = device_timeline([&] {
    auto staged = stager.stage_in_background(stowage::dcp::SaveableState(state));
    busy_compute(40);  // the training step that goes on meanwhile, on the default stream
    staged->get();
  });
  EXPECT_TRUE(ran_concurrently(
      timeline, [](const DeviceActivity& a) { return a.is_copy("DtoH"); },
      [](const DeviceActivity& a) { return a.is_kernel(); }))
      << describe(timeline);
}

TEST(Device, SwapOptimizerUploadsDownloadsAndUpdatesOverlap) {
  SKIP_WITHOUT_A_GPU();
  torch::manual_seed(0);
  std::vector<at::Tensor> params;
  for (int i = 0; i < 16; ++i)
    params.push_back(torch::randn({1 << 21}, at::TensorOptions().device(kCuda)).requires_grad_());
  auto adam = std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-3));
  auto optimizer = stowage::optim::swap_optimizer(adam, stowage::optim::SwapOptimizerConfig().swap_times(8));
  const auto set_grads = [&] {
    for (auto& p : params) p.mutable_grad() = torch::randn_like(p);
  };
  set_grads();
  optimizer->step();  // creates the states and lays them out on the host
  set_grads();
  const auto timeline = device_timeline([&] { optimizer->step(); });
  const auto upload = [](const DeviceActivity& a) { return a.is_copy("HtoD"); };
  const auto download = [](const DeviceActivity& a) { return a.is_copy("DtoH"); };
  const auto update = [](const DeviceActivity& a) { return a.is_kernel(); };
  EXPECT_TRUE(ran_concurrently(timeline, upload, download)) << describe(timeline);
  EXPECT_TRUE(ran_concurrently(timeline, upload, update)) << describe(timeline);
  EXPECT_TRUE(ran_concurrently(timeline, download, update)) << describe(timeline);
}

// (Bit-identity of a resumed run is tested on the CPU: on CUDA, embedding backward
// accumulates with atomics, whose order varies from run to run.)
TEST(Device, StowageTrainRunsOnCudaAndResumesFromItsCheckpoint) {
  SKIP_WITHOUT_A_GPU();
  using namespace stowage::testing;
  RunDir dir;
  const auto first = train(dir, "--device cuda:0 --steps 8 --ckpt-every 4");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("on cuda:0"), std::string::npos) << first.output;
  const auto resumed = train(dir, "--device cuda:0 --steps 12 --ckpt-every 4 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("(step 8)"), std::string::npos) << resumed.output;
  EXPECT_EQ(fingerprint(step_dir(dir, 8)).size(), fingerprint(step_dir(dir, 12)).size());
}

#endif

}  // namespace
