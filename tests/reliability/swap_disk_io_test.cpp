// The swap optimizer's disk tier on a real file system that fails: a full disk when the
// scratch files are made, and the kernel's EIO in the middle of a step (an ext4 on a loop
// device cut short under the files). Either way the step fails with the cause and the
// file, the optimizer stays where it was, and (once the disk has room again) goes on.

#include <stowage/error.h>

#include "optim/swap_test_util.h"
#include "reliability/file_space.h"
#include "reliability/loop_file_system.h"
#include "state/optimizer_state_key.h"

#include <gmock/gmock.h>

#include <cerrno>
#include <filesystem>

#include <unistd.h>

namespace stowage::reliability {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr int64_t kNumel = 65536;  // 256 KiB of fp32; two states per parameter
const optim::testing::Shapes kShapes(8, {kNumel});

int64_t step_count(optim::SwapOptimizer& swap, const at::Tensor& param) {
  auto* state = stowage::detail::find_state(swap.optimizer().state(), param);
  return state == nullptr ? 0 : static_cast<torch::optim::AdamWParamState&>(*state).step();
}

TEST(SwapDiskIo, AFullDiskRefusesTheScratchFilesAndChangesNothing) {
  LoopFileSystem disk;
  if (!disk.unavailable().empty()) GTEST_SKIP() << "no loop-mounted ext4 here: " << disk.unavailable();
  const std::string dir = disk.sub("swap");
  fs::create_directory(dir);
  fill_synced(disk.sub("filler"), disk.free_bytes() - (2 << 20));  // 2 MiB left; the states take 4
  if (::testing::Test::HasFatalFailure()) return;
  auto params = optim::testing::make_params(kShapes);
  auto plain_params = optim::testing::clone_params(params);
  auto swap = optim::swap_optimizer(optim::testing::adamw(params), optim::SwapOptimizerConfig().swap_dir(dir));
  auto plain = optim::testing::adamw(plain_params);
  optim::testing::set_grads(params, 0);
  try {
    swap->step();
    FAIL() << "step() did not throw";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ENOSPC);
    EXPECT_EQ(e.operation(), "allocate");
    EXPECT_THAT(e.path(), HasSubstr(dir + "/"));
    EXPECT_THAT(e.what(), HasSubstr("No space left on device"));
  }
  optim::testing::expect_params_equal(plain_params, params);
  EXPECT_TRUE(swap->optimizer().state().empty());
  EXPECT_TRUE(fs::is_empty(dir));
  // With room again, the same step succeeds and the optimizer goes on as a plain one.
  fs::remove(disk.sub("filler"));
  ::sync();  // the file system counts the filler's blocks free once its removal is written
  for (int step = 0; step < 3; ++step) {
    optim::testing::set_grads(params, step);
    optim::testing::set_grads(plain_params, step);
    swap->step();
    plain->step();
  }
  optim::testing::expect_params_equal(plain_params, params);
  optim::testing::expect_state_dicts_equal(optim::testing::plain_state_dict(plain), swap->state_dict());
}

TEST(SwapDiskIo, TheKernelsEioInTheMiddleOfAStepLeavesEveryParameterAsItWas) {
  LoopFileSystem disk;
  if (!disk.unavailable().empty()) GTEST_SKIP() << "no loop-mounted ext4 here: " << disk.unavailable();
  const std::string dir = disk.sub("swap");
  fs::create_directory(dir);
  // The filler takes the front of the file system, the scratch files come after it: the
  // cut at the end of the filler puts every block of theirs past the end of the device.
  fill_synced(disk.sub("filler"), disk.free_bytes() - (8 << 20));
  if (::testing::Test::HasFatalFailure()) return;
  const int64_t cut = disk.end_of_used_space();
  auto params = optim::testing::make_params(kShapes);
  auto plain_params = optim::testing::clone_params(params);
  auto swap =
      optim::swap_optimizer(optim::testing::adamw(params), optim::SwapOptimizerConfig().swap_dir(dir).swap_times(4));
  auto plain = optim::testing::adamw(plain_params);
  for (int step = 0; step < 2; ++step) {
    optim::testing::set_grads(params, step);
    optim::testing::set_grads(plain_params, step);
    swap->step();
    plain->step();
  }
  ASSERT_TRUE(swap->disk_stats().direct_io) << "the reads would come from the page cache";
  disk.cut_device_at(cut);
  if (::testing::Test::HasFatalFailure()) return;
  optim::testing::set_grads(params, 2);
  try {
    swap->step();
    FAIL() << "step() did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Input/output error"));
    EXPECT_THAT(e.what(), HasSubstr(dir + "/"));
    EXPECT_THAT(e.what(), HasSubstr("no parameter was updated"));
  }
  // The states cannot be read any more (their blocks are gone), but nothing moved: every
  // parameter and step count is where two steps left them.
  optim::testing::expect_params_equal(plain_params, params);
  for (const auto& param : params) EXPECT_EQ(step_count(*swap, param), 2);
}

}  // namespace
}  // namespace stowage::reliability
