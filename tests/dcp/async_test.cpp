// DefaultStager and async_save: background staging, cached and shared buffers, one
// save in flight per writer, errors through the future, threads that always end, and
// staged buffers freed as they are written.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::test_device;

size_t thread_count() {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

StateDict filled(float value, int count = 4, int64_t numel = 1024) {
  StateDict state;
  for (int i = 0; i < count; ++i) state.insert("t" + std::to_string(i), torch::full({numel}, value).to(test_device()));
  return state;
}

// A one-shot gate one thread waits on and another opens.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Holds its first save at the first item until released.
class HeldWriter : public FileSystemWriter {
 public:
  using FileSystemWriter::FileSystemWriter;
  ~HeldWriter() override { wait_for_pending_save(); }
  Gate reached;
  Gate release;

 protected:
  void on_item_written(const WriteResult&) override {
    if (!held_.exchange(true)) {
      reached.open();
      release.wait();
    }
  }

 private:
  std::atomic<bool> held_{false};
};

TEST(DcpDefaultStager, StagesInTheBackgroundIntoADecoupledSnapshot) {
  StateDict state = filled(3);
  DefaultStager stager;
  EXPECT_TRUE(stager.should_synchronize_after_execute());
  auto future = stager.stage_in_background(state);
  ASSERT_TRUE(future.has_value());
  const StateDict staged = future->get();
  state.at("t0").toTensor().fill_(-1);
  EXPECT_TRUE(staged.at("t0").toTensor().device().is_cpu());
  EXPECT_TRUE(torch::equal(staged.at("t0").toTensor(), torch::full({1024}, 3.0f)));
  EXPECT_EQ(memory::is_pinned(staged.at("t0").toTensor()), memory::can_pin_memory());
  stager.synchronize_staging();

  DefaultStager synchronous(StagingOptions(false, false, false, false));
  EXPECT_FALSE(synchronous.stage_in_background(state).has_value());
  EXPECT_TRUE(torch::equal(synchronous.stage(state).at("t0").toTensor(), torch::full({1024}, -1.0f)));
}

TEST(DcpDefaultStager, CachesBuffersAcrossCallsAndCloseReleasesThem) {
  StateDict state = filled(1);
  DefaultStager stager(StagingOptions().use_shared_memory(false));
  const int64_t host_before = memory::host_buffer_stats().current_bytes;
  const void* first = stager.stage(state).at("t1").toTensor().data_ptr();
  EXPECT_EQ(stager.cached_bytes(), 4 * 1024 * 4);
  state.at("t1").toTensor().fill_(5);
  const at::Tensor second = stager.stage(state).at("t1").toTensor();
  EXPECT_EQ(second.data_ptr(), first);
  EXPECT_TRUE(torch::equal(second, torch::full({1024}, 5.0f)));
  EXPECT_EQ(memory::host_buffer_stats().current_bytes - host_before, 4 * 1024 * 4);
  stager.close();
  EXPECT_EQ(stager.cached_bytes(), 0);
  // `second` still holds its own buffer; the other three are gone.
  EXPECT_EQ(memory::host_buffer_stats().current_bytes - host_before, 1024 * 4);
  // A stager stages again after close().
  EXPECT_TRUE(torch::equal(stager.stage(state).at("t0").toTensor(), torch::full({1024}, 1.0f)));
}

TEST(DcpDefaultStager, ViewsSharingAStorageShareOneStagedStorage) {
  const at::Tensor base = torch::arange(12, torch::kFloat32).to(test_device());
  const at::Tensor other = torch::ones({3}).to(test_device());
  StateDict state;
  state.insert("front", base.slice(0, 0, 6));
  state.insert("grid", base.view({3, 4}).t());  // non-contiguous view of the same storage
  state.insert("other", other);
  DefaultStager stager;
  const StateDict staged = stager.stage(state);
  const at::Tensor front = staged.at("front").toTensor();
  const at::Tensor grid = staged.at("grid").toTensor();
  EXPECT_TRUE(front.storage().is_alias_of(grid.storage()));
  EXPECT_FALSE(front.storage().is_alias_of(staged.at("other").toTensor().storage()));
  EXPECT_EQ(stager.cached_bytes(), 12 * 4 + 3 * 4);  // 2 storages for 3 tensors
  EXPECT_TRUE(torch::equal(grid, base.view({3, 4}).t().cpu()));
  EXPECT_EQ(grid.strides(), base.view({3, 4}).t().strides());
  front.fill_(0);  // shared in the snapshot as in the source
  EXPECT_EQ(grid.sum().item<float>(), base.slice(0, 6, 12).sum().item<float>());
}

TEST(DcpDefaultStager, LazyConjugateAndNegativeViewsKeepTheirValues) {
  const at::Tensor complex = torch::randn({4}, torch::kComplexFloat).to(test_device());
  const at::Tensor real = torch::randn({4}).to(test_device());
  StateDict state;
  state.insert("conj", complex.conj());
  state.insert("neg", real._neg_view());
  DefaultStager stager;
  const StateDict staged = stager.stage(state);
  EXPECT_TRUE(torch::equal(staged.at("conj").toTensor().resolve_conj(), complex.conj().resolve_conj().cpu()));
  EXPECT_TRUE(torch::equal(staged.at("neg").toTensor().resolve_neg(), (-real).cpu()));
  const ScratchDir dir;
  FileSystemWriter writer(dir.path());
  async_save(state, writer, &stager).upload_completion.get();
  StateDict target;
  target.insert("conj", torch::zeros({4}, torch::kComplexFloat));
  target.insert("neg", torch::zeros({4}));
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(target.at("conj").toTensor(), complex.conj().resolve_conj().cpu()));
  EXPECT_TRUE(torch::equal(target.at("neg").toTensor(), (-real).cpu()));
}

TEST(DcpDefaultStager, ForgetsBuffersOfSourcesThatDied) {
  DefaultStager stager(StagingOptions().use_async_staging(false));
  {
    StateDict state = filled(1, 2);
    stager.stage(state);
    EXPECT_EQ(stager.cached_bytes(), 2 * 1024 * 4);
  }
  StateDict replacement = filled(2, 1);
  stager.stage(replacement);
  EXPECT_EQ(stager.cached_bytes(), 1024 * 4);
}

TEST(DcpAsyncSave, BackgroundStagingReportsThroughTheStagingFuture) {
  struct CountingStager : DefaultStager {
    void synchronize_staging() override {
      ++synchronized;
      DefaultStager::synchronize_staging();
    }
    int synchronized = 0;
  };
  const ScratchDir dir;
  StateDict state = filled(7);
  CountingStager stager;
  FileSystemWriter writer(dir.path());
  AsyncSaveResponse response = async_save(state, writer, &stager);
  response.staging_completion.wait();
  state.at("t0").toTensor().fill_(-1);  // after staging: must not reach the checkpoint
  response.upload_completion.get();
  // PyTorch's rule: with a staging future, async_save leaves synchronization to the caller.
  EXPECT_EQ(stager.synchronized, 0);
  StateDict target = filled(0);
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(target.at("t0").toTensor(), torch::full({1024}, 7.0f)));
}

TEST(DcpAsyncSave, ASecondSaveOnTheSameWriterWaitsForTheFirst) {
  const ScratchDir dir;
  HeldWriter writer(dir.path(), FileSystemWriterOptions().cache_staged_state_dict(true));
  AsyncSaveResponse first = async_save(filled(1), writer);
  writer.reached.wait();
  EXPECT_TRUE(writer.has_pending_save());
  EXPECT_THROW(async_save(filled(2), writer, nullptr, AsyncSaveOptions().if_save_pending(PendingSave::kReject)),
               Error);

  std::atomic<bool> second_started{false};
  AsyncSaveResponse second;
  std::thread caller([&] {
    second = async_save(filled(2), writer);  // must wait: the cached buffers are being written
    second_started = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second_started.load());
  writer.release.open();
  caller.join();
  first.upload_completion.get();
  second.upload_completion.get();
  StateDict target = filled(0);
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(target.at("t3").toTensor(), torch::full({1024}, 2.0f)));
}

TEST(DcpAsyncSave, AWriteErrorReachesTheUploadFuture) {
  struct BrokenWriter : FileSystemWriter {
    using FileSystemWriter::FileSystemWriter;
    ~BrokenWriter() override { wait_for_pending_save(); }
    void on_item_written(const WriteResult& result) override {
      throw Error("disk on fire while writing " + result.fqn);
    }
  };
  const ScratchDir dir;
  save(filled(1), dir.path());
  const std::vector<std::string> before = testing::list_files(dir.path());
  BrokenWriter writer(dir.path());
  AsyncSaveResponse response = async_save(filled(2), writer);
  response.staging_completion.get();
  try {
    response.upload_completion.get();
    FAIL() << "expected the error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  EXPECT_EQ(testing::list_files(dir.path()), before);
  // A later save on the same writer reports its own outcome.
  EXPECT_THROW(async_save(filled(3), writer).upload_completion.get(), Error);
}

TEST(DcpAsyncSave, ValidationErrorsAreThrownAtOnce) {
  const ScratchDir dir;
  FileSystemWriter writer(dir.path());
  StateDict bad;
  bad.insert("tuple", c10::ivalue::Tuple::create({c10::IValue(1)}));
  EXPECT_THROW(async_save(bad, writer), InvalidArgument);
  EXPECT_FALSE(writer.has_pending_save());
}

TEST(DcpAsyncSave, DestructorsWaitAndLeaveNoThreads) {
  const size_t threads_before = thread_count();
  const ScratchDir dir;
  std::shared_future<Metadata> upload;
  {
    HeldWriter writer(dir.path());
    DefaultStager stager;
    upload = async_save(filled(4), writer, &stager).upload_completion;
    writer.reached.wait();
    writer.release.open();
    // Both go out of scope with the save possibly still running.
  }
  EXPECT_EQ(upload.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(upload.get().save_id.empty());
  {
    DefaultStager stager;
    for (int i = 0; i < 3; ++i) stager.stage_in_background(filled(static_cast<float>(i)));
    stager.close();
    stager.close();  // idempotent
  }
  EXPECT_EQ(thread_count(), threads_before);
}

TEST(DcpAsyncSave, UncachedStagedBuffersAreFreedAsTheyAreWritten) {
  constexpr int kTensors = 8;
  constexpr int64_t kBytes = int64_t(1) << 20;
  struct WatchingWriter : FileSystemWriter {
    using FileSystemWriter::FileSystemWriter;
    ~WatchingWriter() override { wait_for_pending_save(); }
    void on_item_written(const WriteResult&) override {
      host_bytes.push_back(memory::host_buffer_stats().current_bytes);
    }
    std::vector<int64_t> host_bytes;
  };
  const ScratchDir dir;
  const int64_t baseline = memory::host_buffer_stats().current_bytes;
  StateDict state = filled(1, kTensors, kBytes / 4);
  WatchingWriter writer(dir.path());
  async_save(state, writer).upload_completion.get();
  ASSERT_EQ(writer.host_bytes.size(), size_t(kTensors));
  for (int k = 0; k < kTensors; ++k) {
    // After k + 1 tensors are written, only the rest are still staged.
    EXPECT_EQ(writer.host_bytes[k] - baseline, (kTensors - 1 - k) * kBytes) << k;
  }
  EXPECT_EQ(memory::host_buffer_stats().current_bytes, baseline);
}

}  // namespace
}  // namespace stowage::dcp
