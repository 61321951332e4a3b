// The swap optimizer's disk tier: states live in scratch files between steps, the host
// buffers stay within their budget, both I/O paths run, a failed read or write (a full
// disk part way through) leaves a consistent optimizer, and checkpoints stream from and
// into the files. Numerics, copy faults and state dicts on the disk tier are covered by
// the tests parameterised over testing::swap_modes().

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>

#include "dcp/fault_injection_env.h"
#include "optim/swap_test_util.h"

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

namespace stowage::optim {
namespace {

using dcp::testing::Call;
using testing::clone_params;
using ::testing::HasSubstr;
using testing::make_params;
using testing::set_grads;
using testing::swap_test_dir;

constexpr int64_t kDiskNumel = 16384;                    // 64 KiB of fp32 per state
constexpr int64_t kDiskStateBytes = 2 * 4 * kDiskNumel;  // exp_avg and exp_avg_sq of one parameter
constexpr size_t kDiskParams = 16;

SwapOptimizerConfig disk_tier_config(SwapIoPath path = SwapIoPath::kAuto) {
  return SwapOptimizerConfig().swap_dir(swap_test_dir()).io_path(path).swap_times(4);
}

// A disk-tier swap optimizer and a plain AdamW that take the same steps.
struct DiskPair {
  explicit DiskPair(const SwapOptimizerConfig& config)
      : params(make_params(testing::Shapes(kDiskParams, {kDiskNumel}))), plain_params(clone_params(params)) {
    swap = swap_optimizer(testing::adamw(params), SwapOptimizerConfig(config).file_env(&files));
    plain = testing::adamw(plain_params);
  }
  void step(int step) {
    set_grads(params, step);
    set_grads(plain_params, step);
    swap->step();
    plain->step();
  }
  void expect_matches_plain() {
    testing::expect_params_equal(plain_params, params);
    testing::expect_state_dicts_equal(testing::plain_state_dict(plain), swap->state_dict());
  }
  // Step `step` with the step's k-th batch read or write (`call`), and the `times` - 1 after
  // it, failing with `error`: the step's error message (a test failure if it did not
  // throw). The fault is removed again. A step reads its batches in order, one call each,
  // and writes them in order; recovery then writes again, in order, the batches whose
  // writes did not succeed.
  std::string failing_step(int step, Call call, int64_t k, int error, int64_t times = 1) {
    files.fail(call, k, error, times);
    set_grads(params, step);
    std::string message;
    try {
      swap->step();
      ADD_FAILURE() << "step() did not throw";
    } catch (const Error& e) {
      message = e.what();
    }
    files.fail(call, 0);
    return message;
  }
  // After a failed step: the plain optimizer takes it with gradients for the parameters
  // the swap updated (those whose step count moved), then both must agree.
  void catch_up_after_failed_step(int step, int64_t count) {
    const auto state = swap->state_dict().at("state").toGenericDict();
    set_grads(plain_params, step,
              [&](size_t i, int) { return state.at(std::to_string(i)).toGenericDict().at("step").toInt() == count; });
    plain->step();
    expect_matches_plain();
  }

  dcp::testing::FaultInjectionEnv files;  // before `swap`, which uses it until destroyed
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> plain_params;
  c10::intrusive_ptr<SwapOptimizer> swap;
  std::shared_ptr<torch::optim::AdamW> plain;
};

class SwapDiskTier : public ::testing::TestWithParam<SwapIoPath> {
 protected:
  void SetUp() override { memory::enable_accounting(); }
};

TEST_P(SwapDiskTier, ReportsTheIoPathThatRuns) {
  DiskPair pair(disk_tier_config(GetParam()));
  pair.step(0);
  EXPECT_EQ(pair.swap->disk_stats().io_path, GetParam());
  EXPECT_EQ(pair.swap->disk_stats().file_bytes, static_cast<int64_t>(kDiskParams) * kDiskStateBytes);
}

TEST_P(SwapDiskTier, StaysWithinItsHostBudgetWhenTheStateIsManyTimesLarger) {
  // 2 MiB of state through 512 KiB of buffers: four of 128 KiB, one parameter's states
  // each, so sixteen batches although swap_times asks for four.
  const int64_t budget = 4 * kDiskStateBytes;
  DiskPair pair(disk_tier_config(GetParam()).host_budget_bytes(budget));
  for (int step = 0; step < 3; ++step) {
    pair.step(step);
    pair.expect_matches_plain();
  }
  const DiskTierStats stats = pair.swap->disk_stats();
  EXPECT_LE(stats.peak_host_bytes, budget);
  EXPECT_EQ(stats.buffer_bytes, kDiskStateBytes);
  // Every step reads and writes each state once: three steps of which the first starts
  // from zeros in the files as well.
  EXPECT_EQ(stats.read_bytes, 3 * static_cast<int64_t>(kDiskParams) * kDiskStateBytes);
  EXPECT_EQ(stats.written_bytes, 3 * static_cast<int64_t>(kDiskParams) * kDiskStateBytes);
}

TEST_P(SwapDiskTier, RefusesAParameterLargerThanOneBuffer) {
  DiskPair pair(disk_tier_config(GetParam()).host_budget_bytes(2 * kDiskStateBytes).buffer_count(4));
  set_grads(pair.params, 0);
  try {
    pair.swap->step();
    FAIL() << "step() did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter 0 (param group 0) take 131072 bytes"));
    EXPECT_THAT(e.what(), HasSubstr("host_budget_bytes 262144 / buffer_count 4 gives 65536 bytes"));
  }
  // Nothing was updated.
  testing::expect_params_equal(pair.plain_params, pair.params);
}

TEST_P(SwapDiskTier, KeepsItsStatesInUnlinkedFilesAndNotInMemory) {
  const int64_t before = memory::memory_allocated();
  DiskPair pair(disk_tier_config(GetParam()));
  pair.step(0);
  pair.step(1);
  // Between steps the swap's states take no LibTorch memory: what is allocated is both
  // sides' parameters and gradients and the plain AdamW's two states per parameter.
  int64_t params_and_grads = 0;
  for (const auto& p : pair.params) params_and_grads += 2 * static_cast<int64_t>(p.nbytes());
  EXPECT_EQ(memory::memory_allocated() - before, 3 * params_and_grads);
  // The directory shows nothing: the files are gone from it as soon as they are open.
  EXPECT_TRUE(std::filesystem::is_empty(swap_test_dir()));
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int mapped = 0;
  while (std::getline(maps, line)) {
    if (line.find(swap_test_dir()) != std::string::npos && line.find("(deleted)") != std::string::npos) ++mapped;
  }
  EXPECT_GE(mapped, 1);
  pair.expect_matches_plain();
}

TEST_P(SwapDiskTier, AFailedReadStopsTheStepAndTheOptimizerGoesOn) {
  for (int64_t batch : {0, 2, 3}) {
    SCOPED_TRACE("read of batch " + std::to_string(batch));
    DiskPair pair(disk_tier_config(GetParam()));
    pair.step(0);
    const std::string message = pair.failing_step(1, Call::kRead, batch + 1, EIO);
    EXPECT_THAT(message, HasSubstr("Input/output error"));
    // Batch b is read while batch b - 1 is updated, and waited for when b - 2 is done.
    EXPECT_THAT(message,
                HasSubstr(fmt::format("the update stopped in batch {} of 4", std::max<int64_t>(0, batch - 1))));
    pair.catch_up_after_failed_step(1, 2);
    pair.step(2);
    pair.expect_matches_plain();
  }
}

TEST_P(SwapDiskTier, AWriteThatRunsOutOfSpaceOnceIsWrittenAgain) {
  for (int64_t batch : {0, 1, 3}) {
    SCOPED_TRACE("write of batch " + std::to_string(batch));
    DiskPair pair(disk_tier_config(GetParam()).buffer_count(2));
    pair.step(0);
    const std::string message = pair.failing_step(1, Call::kWrite, batch + 1, ENOSPC);
    EXPECT_THAT(message, HasSubstr("No space left on device"));
    EXPECT_THAT(message, HasSubstr("downloaded again"));
    pair.catch_up_after_failed_step(1, 2);
    pair.step(2);
    pair.expect_matches_plain();
  }
}

TEST_P(SwapDiskTier, StatesThatCannotBeWrittenStayOnTheDeviceUntilTheNextStep) {
  DiskPair pair(disk_tier_config(GetParam()));
  pair.step(0);
  // Batch 1's write fails, and so does recovery's second try of it (the step's third write).
  const std::string message = pair.failing_step(1, Call::kWrite, 2, ENOSPC, /*times=*/2);
  EXPECT_THAT(message, HasSubstr("No space left on device"));
  EXPECT_THAT(message, HasSubstr("stay on the device until the next step"));
  pair.catch_up_after_failed_step(1, 2);
  pair.step(2);
  pair.expect_matches_plain();
  pair.step(3);
  pair.expect_matches_plain();
}

TEST_P(SwapDiskTier, ACheckpointStreamsFromTheFilesAndLoadsIntoThem) {
  DiskPair pair(disk_tier_config(GetParam()));
  for (int step = 0; step < 2; ++step) pair.step(step);
  const std::string dir = swap_test_dir() + "-checkpoint-" + std::to_string(::getpid());
  StateDict state;
  state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(pair.swap)));
  // The save reads the states through the files' mappings: LibTorch's allocator hands
  // out far less than the state's size meanwhile.
  memory::reset_peak_memory_stats();
  const int64_t base = memory::memory_allocated();
  dcp::save(state, dir);
  EXPECT_LT(memory::max_memory_allocated() - base, static_cast<int64_t>(kDiskParams) * kDiskStateBytes / 4);

  auto restored_params = clone_params(pair.params);
  auto restored = swap_optimizer(testing::adamw(restored_params), disk_tier_config(GetParam()));
  StateDict target;
  target.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(restored)));
  dcp::load(target, dir);
  testing::expect_state_dicts_equal(pair.swap->state_dict(), restored->state_dict());
  EXPECT_TRUE(std::filesystem::is_empty(swap_test_dir()));
  // The restored optimizer goes on as the original does.
  set_grads(restored_params, 2);
  restored->step();
  pair.step(2);
  testing::expect_params_equal(pair.params, restored_params);
  testing::expect_state_dicts_equal(pair.swap->state_dict(), restored->state_dict());
  std::filesystem::remove_all(dir);
}

TEST(SwapDiskTierConfig, ANonexistentDirectoryIsNamed) {
  auto params = make_params({{kDiskNumel}});
  try {
    swap_optimizer(testing::adamw(params), SwapOptimizerConfig().swap_dir("/nonexistent/stowage-swap"));
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("swap_dir '/nonexistent/stowage-swap' is not a directory"));
  }
}

TEST(SwapDiskTierConfig, OptionsAreChecked) {
  EXPECT_THROW(SwapOptimizerConfig().swap_dir("/tmp").buffer_count(1).validate(), InvalidArgument);
  EXPECT_THROW(SwapOptimizerConfig().host_budget_bytes(1 << 20).validate(), InvalidArgument);
  EXPECT_THROW(SwapOptimizerConfig().swap_dir("/tmp").host_budget_bytes(-1).validate(), InvalidArgument);
  EXPECT_NO_THROW(SwapOptimizerConfig().swap_dir("/tmp").host_budget_bytes(1 << 20).validate());
}

TEST(SwapDiskTierConfig, TheHostTierHasNoDiskStats) {
  auto params = make_params({{kDiskNumel}});
  auto swap = swap_optimizer(testing::adamw(params));
  EXPECT_THROW(swap->disk_stats(), Error);
}

INSTANTIATE_TEST_SUITE_P(IoPaths, SwapDiskTier, ::testing::Values(SwapIoPath::kIoUring, SwapIoPath::kThreads),
                         [](const auto& info) { return info.param == SwapIoPath::kIoUring ? "IoUring" : "Threads"; });

}  // namespace
}  // namespace stowage::optim
