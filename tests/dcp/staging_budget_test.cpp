// Staging within a host budget (AsyncSaveOptions::staging_budget_bytes): a state larger
// than the budget is staged in waves that fit, each written before the next reuses the
// buffer; the checkpoint loads bit-identical, the staging buffers never exceed the
// budget, staging completes only once the last wave is staged, and an entry larger than
// the budget is refused naming the smallest budget that fits.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <string>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::test_device;

constexpr int kBudgetTensors = 8;
constexpr int64_t kBudgetTensorNumel = 16 * 1024;  // 64 KiB of float each
constexpr int64_t kBudgetTensorBytes = kBudgetTensorNumel * 4;

// Eight tensors of distinct random values, on the test device, and a value.
StateDict budget_test_state() {
  StateDict state;
  for (int i = 0; i < kBudgetTensors; ++i) {
    state.insert("layer" + std::to_string(i), torch::randn({kBudgetTensorNumel}).to(test_device()));
  }
  state.insert("step", c10::IValue(int64_t(7)));
  return state;
}

// The wave each data file of `dir` belongs to ("data-<id>-r0-w<N>-0.data").
std::set<std::string> waves_written(const std::string& dir) {
  std::set<std::string> waves;
  for (const std::string& name : testing::data_files(dir)) {
    const size_t at = name.find("-w");
    if (at != std::string::npos) waves.insert(name.substr(at + 1, name.find('-', at + 1) - at - 1));
  }
  return waves;
}

void expect_loads_identical(const StateDict& saved, const std::string& dir) {
  StateDict loaded;
  for (int i = 0; i < kBudgetTensors; ++i) {
    loaded.insert("layer" + std::to_string(i), torch::zeros({kBudgetTensorNumel}).to(test_device()));
  }
  loaded.insert("step", c10::IValue(int64_t(0)));
  load(loaded, dir);
  for (int i = 0; i < kBudgetTensors; ++i) {
    const std::string key = "layer" + std::to_string(i);
    EXPECT_TRUE(torch::equal(loaded.at(key).toTensor().cpu(), saved.at(key).toTensor().cpu())) << key;
  }
  EXPECT_EQ(loaded.at("step").toInt(), 7);
}

TEST(DcpStagingBudget, AStateLargerThanTheBudgetStagesInWavesWithinItAndLoadsBitIdentical) {
  ScratchDir dir;
  const StateDict state = budget_test_state();
  const int64_t budget = kBudgetTensors * kBudgetTensorBytes / 4;  // a quarter of the state
  const int64_t held_before = memory::host_buffer_stats().checkpoint_bytes;
  memory::reset_peak_host_buffer_stats();
  DefaultStager stager;
  FileSystemWriter writer(dir.path());
  AsyncSaveResponse response =
      async_save(state, writer, &stager, AsyncSaveOptions().staging_budget_bytes(budget), std::nullopt);
  response.staging_completion.get();
  response.upload_completion.get();
  const int64_t staging_peak = memory::host_buffer_stats().checkpoint_peak_bytes - held_before;
  EXPECT_GT(staging_peak, 0) << "the waves were staged in host buffers";
  EXPECT_LE(staging_peak, budget);
  EXPECT_EQ(waves_written(dir.path()).size(), 4u);
  EXPECT_EQ(stager.cached_bytes(), 0) << "the stager's cache is not used";
  expect_loads_identical(state, dir.path());
}

TEST(DcpStagingBudget, AStateWithinTheBudgetIsOneWave) {
  ScratchDir dir;
  const StateDict state = budget_test_state();
  async_save(state, dir.path(), nullptr, AsyncSaveOptions().staging_budget_bytes(int64_t(1) << 30))
      .upload_completion.get();
  EXPECT_EQ(waves_written(dir.path()), std::set<std::string>{"w0"});
  expect_loads_identical(state, dir.path());
}

// Blocks the first item's write until the test lets it go.
class HeldFirstWriteWriter final : public FileSystemWriter {
 public:
  using FileSystemWriter::FileSystemWriter;
  void wait_until_held() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return held_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 protected:
  void on_item_written(const WriteResult&) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (held_) return;
    held_ = true;
    changed_.notify_all();
    changed_.wait(lock, [this] { return released_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool held_ = false;
  bool released_ = false;
};

TEST(DcpStagingBudget, StagingCompletesOnlyOnceTheLastWaveIsStaged) {
  ScratchDir dir;
  StateDict state = budget_test_state();
  const StateDict original = budget_test_state();
  for (int i = 0; i < kBudgetTensors; ++i) {
    const std::string key = "layer" + std::to_string(i);
    original.at(key).toTensor().copy_(state.at(key).toTensor());
  }
  HeldFirstWriteWriter writer(dir.path());
  AsyncSaveResponse response =
      async_save(state, writer, nullptr, AsyncSaveOptions().staging_budget_bytes(2 * kBudgetTensorBytes));
  writer.wait_until_held();  // the first wave is being written: three are not staged yet
  EXPECT_NE(response.staging_completion.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  writer.release();
  response.staging_completion.get();
  for (int i = 0; i < kBudgetTensors; ++i) state.at("layer" + std::to_string(i)).toTensor().fill_(-1.0);
  response.upload_completion.get();
  expect_loads_identical(original, dir.path());
}

TEST(DcpStagingBudget, AnEntryLargerThanTheBudgetIsRefusedNamingTheSmallestThatFits) {
  ScratchDir dir;
  StateDict state = budget_test_state();
  state.insert("large", torch::zeros({2 * kBudgetTensorNumel}).to(test_device()));
  try {
    async_save(state, dir.sub("ckpt"), nullptr, AsyncSaveOptions().staging_budget_bytes(kBudgetTensorBytes));
    FAIL() << "a budget below the largest entry was accepted";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'large'"), std::string::npos) << message;
    EXPECT_NE(message.find("smallest staging budget that fits this state is 131072 bytes (128.0 KiB)"),
              std::string::npos)
        << message;
  }
  EXPECT_FALSE(std::filesystem::exists(testing::metadata_path(dir.sub("ckpt"))));
}

}  // namespace
}  // namespace stowage::dcp
