// stowage's device paths on the simulated accelerator: the copy engine, DefaultStager,
// the swap optimizer, a checkpoint's offloaded inputs and async_save's copy before it
// returns run on it as on a GPU, and each synchronization they rely on is shown to
// matter: with it switched off (memory::skip_sync_for_testing), the device exposes the
// bug. A sim::CopyGate holds the copies until something waits for them, so that what
// these tests show does not depend on how fast the machine runs them.
#include <stowage/build_info.h>

#include <gtest/gtest.h>

#if defined(STOWAGE_WITH_SIM)
#include <stowage/activation/checkpoint.h>
#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/staging.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/copy_engine.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/memory/skipped_sync.h>
#include <stowage/sim/sim.h>

#include "dcp/test_util.h"
#include "optim/swap_test_util.h"

#include <gmock/gmock.h>
#include <torch/torch.h>

#include <future>
#include <string>
#include <vector>
#endif

namespace {

#if !defined(STOWAGE_WITH_SIM)

TEST(StowageOnSim, NeedsLibTorch2) {
  GTEST_SKIP() << "the simulated device needs LibTorch 2.x; this build is against "
               << stowage::build_info().libtorch_version;
}

#else

namespace memory = stowage::memory;
namespace sim = stowage::sim;
namespace optim = stowage::optim;
using ::testing::HasSubstr;

c10::Device sim0() {
  sim::register_device();
  return sim::device(0);
}

// Each test may skip one synchronization; none outlives it.
class StowageOnSim : public ::testing::Test {
 protected:
  void TearDown() override {
    memory::skip_sync_for_testing(memory::SkippedSync::kNone);
    sim::synchronize_all();
    sim::clear_hazards();
  }
};

// ---------------------------------------------------------------- copy engine

// Downloads a device tensor the caller drops at once, as CopyEngine's contract allows.
at::Tensor download_dropped_tensor(memory::CopyEngine& engine) {
  memory::HostAllocOptions pinned;
  pinned.pin_memory = true;
  pinned.pin_for = engine.device().type();
  at::Tensor host = memory::allocate_host({4096}, torch::kFloat, pinned);
  {
    at::Tensor on_device = torch::full({4096}, 5.0f, torch::TensorOptions().device(engine.device()));
    engine.wait(memory::CopyLane::kDeviceToHost, engine.record_compute());
    engine.copy(memory::CopyLane::kDeviceToHost, host, on_device);
  }
  engine.synchronize(engine.record(memory::CopyLane::kDeviceToHost));
  return host;
}

TEST_F(StowageOnSim, CopyEngineKeepsADroppedDeviceTensorUntilItsDownloadRan) {
  memory::CopyEngine engine(sim0());
  const sim::CopyGate held;
  EXPECT_TRUE(torch::equal(download_dropped_tensor(engine), torch::full({4096}, 5.0f)));
}

TEST_F(StowageOnSim, WithoutRecordStreamTheDownloadReadsFreedPoisonedMemory) {
  memory::CopyEngine engine(sim0());
  const sim::CopyGate held;
  memory::skip_sync_for_testing(memory::SkippedSync::kRecordStream);
  EXPECT_TRUE(torch::isnan(download_dropped_tensor(engine)).all().item<bool>());
}

// ---------------------------------------------------------------- staging

// Values of their own each call: a pinned buffer reused from an earlier staging never
// holds them already.
stowage::StateDict device_state(c10::Device device) {
  static uint64_t calls = 0;
  torch::manual_seed(11 + calls++);
  stowage::StateDict state;
  for (int i = 0; i < 4; ++i) {
    state.insert("t" + std::to_string(i), torch::randn({2048 + i}, torch::TensorOptions().device(device)));
  }
  return state;
}

// Stages on the stager's own stream into pinned buffers; true when every staged tensor
// equals its source.
bool staged_equals_source(const stowage::StateDict& state) {
  stowage::dcp::DefaultStager stager(stowage::dcp::StagingOptions(/*pinned=*/true, /*shared=*/false,
                                                                  /*async_staging=*/false, /*non_blocking=*/true));
  const stowage::StateDict staged = stager.stage(stowage::dcp::SaveableState(state)).state_dict();
  bool equal = true;
  for (const auto& item : state) {
    const at::Tensor copy = staged.at(item.key()).toTensor();
    EXPECT_TRUE(memory::is_pinned(copy)) << item.key();
    equal = equal && torch::equal(copy, item.value().toTensor().cpu());
  }
  return equal;
}

TEST_F(StowageOnSim, DefaultStagerStagesDeviceTensorsThroughItsOwnStream) {
  const stowage::StateDict state = device_state(sim0());
  const sim::CopyGate held;
  EXPECT_TRUE(staged_equals_source(state));
}

TEST_F(StowageOnSim, WithoutTheStagingWaitTheSnapshotIsReadBeforeItsBytesArrive) {
  const stowage::StateDict state = device_state(sim0());
  const sim::CopyGate held;
  memory::skip_sync_for_testing(memory::SkippedSync::kStagingWait);
  EXPECT_FALSE(staged_equals_source(state));
}

// ---------------------------------------------------------------- offloaded inputs

// The input's and the weight's gradients through a checkpoint whose inputs wait in host
// memory until backward, on `device`.
std::vector<at::Tensor> offloaded_gradients(c10::Device device) {
  torch::manual_seed(5);
  torch::nn::Linear layer(64, 64);
  layer->to(device);
  const at::Tensor x = torch::randn({32, 64}).to(device).requires_grad_();
  const auto run = [&](const at::Tensor& in) { return torch::gelu(layer->forward(in)); };
  stowage::activation::checkpoint(run, x, stowage::activation::CheckpointOptions().offload_inputs(true))
      .pow(2)
      .sum()
      .backward();
  return {x.grad().cpu(), layer->weight.grad().cpu()};
}

TEST_F(StowageOnSim, OffloadedInputsAreBackBeforeTheRecomputationReadsThem) {
  const std::vector<at::Tensor> on_cpu = offloaded_gradients(c10::kCPU);
  const sim::CopyGate held;
  const std::vector<at::Tensor> on_sim = offloaded_gradients(sim0());
  for (size_t i = 0; i < on_cpu.size(); ++i) EXPECT_TRUE(torch::equal(on_sim[i], on_cpu[i])) << "gradient " << i;
  EXPECT_TRUE(sim::hazards().empty()) << sim::hazards().front();
}

TEST_F(StowageOnSim, WithoutTheOffloadWaitTheRecomputationReadsInputsStillBeingCopied) {
  const sim::CopyGate held;
  memory::skip_sync_for_testing(memory::SkippedSync::kOffloadWait);
  try {
    offloaded_gradients(sim0());
    FAIL() << "the recomputation read offloaded inputs whose upload had not finished";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("hazard on sim:0"));
    EXPECT_THAT(e.what(), HasSubstr("is still writing"));
  }
}

// ---------------------------------------------------------------- async_save's copy before return

// Stages in the background only once the test opens it: the caller's next steps run
// before the snapshot is staged.
class GatedStager final : public stowage::dcp::AsyncStager {
 public:
  std::optional<std::shared_future<stowage::dcp::SaveableState> > stage_in_background(
      const stowage::dcp::SaveableState& state) override {
    return std::async(std::launch::async,
                      [opened = opened_, state] {
                        opened.wait();
                        return stowage::dcp::BlockingAsyncStager().stage(state);
                      })
        .share();
  }
  void open() { gate_.set_value(); }

 private:
  std::promise<void> gate_;
  std::shared_future<void> opened_ = gate_.get_future().share();
};

// A device tensor async_save is told to copy before it returns is cloned in its stream's
// order: after an upload into it still pending at the call, before the caller's next
// write into it.
TEST_F(StowageOnSim, AsyncSaveClonesANamedDeviceTensorBeforeItReturns) {
  const stowage::dcp::testing::ScratchDir dir;
  at::Tensor tokens_seen = torch::zeros({1024}, torch::TensorOptions().device(sim0()));
  stowage::StateDict loop;
  loop.insert("tokens_seen", tokens_seen);
  stowage::StateDict state;
  state.insert("loop", loop);
  GatedStager stager;
  stowage::dcp::AsyncSaveResponse response;
  {
    const sim::CopyGate held;
    tokens_seen.copy_(torch::full({1024}, 7.0f).pin_memory(), /*non_blocking=*/true);
    response = stowage::dcp::async_save(state, dir.path(), &stager,
                                        stowage::dcp::AsyncSaveOptions().copy_before_return({"loop"}));
    tokens_seen.fill_(9.0f);  // the next step's write
  }
  stager.open();
  response.upload_completion.get();
  stowage::StateDict loaded_loop;
  loaded_loop.insert("tokens_seen", torch::zeros({1024}));
  stowage::StateDict loaded;
  loaded.insert("loop", loaded_loop);
  stowage::dcp::load(loaded, dir.path());
  EXPECT_TRUE(torch::equal(loaded_loop.at("tokens_seen").toTensor(), torch::full({1024}, 7.0f)))
      << loaded_loop.at("tokens_seen").toTensor().slice(0, 0, 4);
  EXPECT_TRUE(sim::hazards().empty()) << sim::hazards().front();
}

// ---------------------------------------------------------------- swap optimizer

class SwapOnSim : public StowageOnSim, public ::testing::WithParamInterface<optim::testing::SwapMode> {};

std::vector<torch::Tensor> to_device(const std::vector<torch::Tensor>& params, c10::Device device) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().to(device).requires_grad_());
  return out;
}

void set_device_grads(std::vector<torch::Tensor>& params, int step) {
  std::vector<torch::Tensor> grads = params;
  optim::testing::set_grads(grads, step);
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].grad().to(params[i].device());
}

TEST_P(SwapOnSim, IsBitIdenticalToAdamWAndKeepsOnlyTwoBatchesOnTheDevice) {
  const c10::Device device = sim0();
  constexpr int64_t kSwapTimes = 4;
  // 32 parameters: the update's one temporary of a parameter's size is under the 5%.
  constexpr int64_t kParams = 32;
  const auto cpu_params = optim::testing::make_params(optim::testing::Shapes(kParams, {optim::testing::kSwappedNumel}));
  auto plain_params = to_device(cpu_params, device);
  auto params = to_device(cpu_params, device);
  torch::optim::AdamW plain(plain_params, torch::optim::AdamWOptions(1e-2));
  auto swap = optim::swap_optimizer(optim::testing::adamw(params),
                                    GetParam().apply(optim::SwapOptimizerConfig().swap_times(kSwapTimes)));
  const int64_t state_bytes = kParams * 2 * optim::testing::kSwappedNumel * 4;
  for (int step = 0; step < 3; ++step) {
    set_device_grads(plain_params, step);
    set_device_grads(params, step);
    plain.step();
    const int64_t before = memory::memory_allocated(device);
    memory::reset_peak_memory_stats(device);
    swap->step();
    sim::synchronize_all();
    EXPECT_EQ(memory::memory_allocated(device), before) << "step " << step << ": states stayed on the device";
    const int64_t peak = memory::max_memory_allocated(device) - before;
    EXPECT_LE(peak, (2.0 / kSwapTimes + 0.05) * state_bytes) << "step " << step;
    EXPECT_GT(peak, 0) << "step " << step;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].cpu(), plain_params[i].cpu())) << "parameter " << i;
  }
  EXPECT_TRUE(sim::hazards().empty()) << sim::hazards().front();
}

TEST_P(SwapOnSim, WithoutTheUploadWaitTheUpdateReadsStatesStillBeingCopied) {
  const c10::Device device = sim0();
  auto params =
      to_device(optim::testing::make_params(optim::testing::Shapes(4, {optim::testing::kSwappedNumel})), device);
  auto swap = optim::swap_optimizer(optim::testing::adamw(params),
                                    GetParam().apply(optim::SwapOptimizerConfig().swap_times(2)));
  set_device_grads(params, 0);
  swap->step();  // creates the states, which go to the host
  set_device_grads(params, 1);
  const sim::CopyGate held;
  memory::skip_sync_for_testing(memory::SkippedSync::kUploadWait);
  try {
    swap->step();
    FAIL() << "the update read states whose upload had not finished";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), HasSubstr("hazard on sim:0"));
    EXPECT_THAT(e.what(), HasSubstr("is still writing"));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SwapOnSim, ::testing::ValuesIn(optim::testing::swap_modes()),
                         optim::testing::mode_name);

#endif

}  // namespace
