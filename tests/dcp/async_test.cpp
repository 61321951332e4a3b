// DefaultStager and async_save: background staging, cached and shared buffers, one
// save in flight per writer, errors through the future, threads that always end, and
// staged buffers freed as they are written.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>

#include <sys/resource.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::state_of;
using testing::test_device;

size_t entries_in(const char* dir) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++count;
  }
  return count;
}

size_t thread_count() {
  return entries_in("/proc/self/task");
}

// A stager's snapshot of `state`, nested again, as async_save's writer would see it.
StateDict stage_state_dict(AsyncStager& stager, const StateDict& state) {
  return stager.stage(SaveableState(state)).state_dict();
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
  auto future = stager.stage_in_background(SaveableState(state));
  ASSERT_TRUE(future.has_value());
  const StateDict staged = future->get().state_dict();
  state.at("t0").toTensor().fill_(-1);
  EXPECT_TRUE(staged.at("t0").toTensor().device().is_cpu());
  EXPECT_TRUE(torch::equal(staged.at("t0").toTensor(), torch::full({1024}, 3.0f)));
  EXPECT_EQ(memory::is_pinned(staged.at("t0").toTensor()), memory::can_pin_memory());
  stager.synchronize_staging();

  DefaultStager synchronous(StagingOptions(false, false, false, false));
  EXPECT_FALSE(synchronous.stage_in_background(SaveableState(state)).has_value());
  EXPECT_TRUE(torch::equal(stage_state_dict(synchronous, state).at("t0").toTensor(), torch::full({1024}, -1.0f)));
}

TEST(DcpDefaultStager, CachesBuffersAcrossCallsAndCloseReleasesThem) {
  StateDict state = filled(1);
  DefaultStager stager(StagingOptions().use_shared_memory(false));
  const int64_t host_before = memory::host_buffer_stats().current_bytes;
  const void* first = stage_state_dict(stager, state).at("t1").toTensor().data_ptr();
  EXPECT_EQ(stager.cached_bytes(), 4 * 1024 * 4);
  state.at("t1").toTensor().fill_(5);
  at::Tensor second = stage_state_dict(stager, state).at("t1").toTensor();
  EXPECT_EQ(second.data_ptr(), first);
  EXPECT_TRUE(torch::equal(second, torch::full({1024}, 5.0f)));
  EXPECT_EQ(memory::host_buffer_stats().current_bytes - host_before, 4 * 1024 * 4);
  stager.close();
  EXPECT_EQ(stager.cached_bytes(), 0);
  // The four buffers share one arena, which `second` still holds; it goes with `second`.
  EXPECT_EQ(memory::host_buffer_stats().current_bytes - host_before, 4 * 1024 * 4);
  second.reset();
  EXPECT_EQ(memory::host_buffer_stats().current_bytes, host_before);
  // A stager stages again after close().
  EXPECT_TRUE(torch::equal(stage_state_dict(stager, state).at("t0").toTensor(), torch::full({1024}, 1.0f)));
}

TEST(DcpDefaultStager, ViewsSharingAStorageShareOneStagedStorage) {
  const at::Tensor base = torch::arange(12, torch::kFloat32).to(test_device());
  const at::Tensor other = torch::ones({3}).to(test_device());
  StateDict state;
  state.insert("front", base.slice(0, 0, 6));
  state.insert("grid", base.view({3, 4}).t());  // non-contiguous view of the same storage
  state.insert("other", other);
  DefaultStager stager;
  const StateDict staged = stage_state_dict(stager, state);
  const at::Tensor front = staged.at("front").toTensor();
  const at::Tensor grid = staged.at("grid").toTensor();
  EXPECT_TRUE(front.storage().is_alias_of(grid.storage()));
  // "other" has bytes of its own (in the same arena, which is one storage).
  const at::Tensor staged_other = staged.at("other").toTensor();
  const auto* front_begin = static_cast<const char*>(front.storage().data()) + front.storage_offset() * 4;
  EXPECT_TRUE(static_cast<const char*>(staged_other.data_ptr()) >= front_begin + 12 * 4 ||
              static_cast<const char*>(staged_other.data_ptr()) + 3 * 4 <= front_begin);
  EXPECT_EQ(stager.cached_bytes(), 12 * 4 + 3 * 4);  // 2 storages for 3 tensors
  EXPECT_TRUE(torch::equal(grid, base.view({3, 4}).t().cpu()));
  EXPECT_EQ(grid.strides(), base.view({3, 4}).t().strides());
  front.fill_(0);  // shared in the snapshot as in the source
  EXPECT_EQ(grid.sum().item<float>(), base.slice(0, 6, 12).sum().item<float>());
  EXPECT_TRUE(torch::equal(staged_other, torch::ones({3})));
}

TEST(DcpDefaultStager, LazyConjugateAndNegativeViewsKeepTheirValues) {
  const at::Tensor complex = torch::randn({4}, torch::kComplexFloat).to(test_device());
  const at::Tensor real = torch::randn({4}).to(test_device());
  StateDict state;
  state.insert("conj", complex.conj());
  state.insert("neg", real._neg_view());
  DefaultStager stager;
  const StateDict staged = stage_state_dict(stager, state);
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
    stage_state_dict(stager, state);
    EXPECT_EQ(stager.cached_bytes(), 2 * 1024 * 4);
  }
  StateDict replacement = filled(2, 1);
  stage_state_dict(stager, replacement);
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

// Every way async_save can stage: the writer itself (cached or not), a
// BlockingAsyncStager (cached or not), a DefaultStager (background or caller's thread).
struct StagerSetUp {
  std::string name;
  bool writer_caches = false;
  std::function<std::unique_ptr<AsyncStager>()> make;  // nullptr: the writer stages
};

std::vector<StagerSetUp> stager_set_ups() {
  return {
      {"writer", false, [] { return nullptr; }},
      {"cached writer", true, [] { return nullptr; }},
      {"BlockingAsyncStager", false, [] { return std::make_unique<BlockingAsyncStager>(); }},
      {"cached BlockingAsyncStager", false, [] { return std::make_unique<BlockingAsyncStager>(true); }},
      {"DefaultStager", false, [] { return std::make_unique<DefaultStager>(); }},
      {"synchronous DefaultStager", false,
       [] { return std::make_unique<DefaultStager>(StagingOptions(false, false, false, false)); }},
  };
}

StateDict with_values() {
  StateDict state;
  state.insert("w", torch::full({16}, 1.0f).to(test_device()));
  state.insert("losses", c10::List<double>({1, 2, 3}));
  state.insert("names", c10::List<std::string>({"a", "b"}));
  state.insert("counts", c10::impl::GenericList(c10::IntType::get()));
  state.insert("extras", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  return state;
}

TEST(DcpAsyncSave, NonTensorValuesAreSnapshotToo) {
  for (const StagerSetUp& set_up : stager_set_ups()) {
    SCOPED_TRACE(set_up.name);
    const ScratchDir dir;
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().cache_staged_state_dict(set_up.writer_caches));
    const std::unique_ptr<AsyncStager> stager = set_up.make();
    for (int round = 0; round < 2; ++round) {  // the second round reuses cached buffers
      StateDict state = with_values();
      AsyncSaveResponse response = async_save(state, writer, stager.get());
      response.staging_completion.get();
      state.at("w").toTensor().fill_(-1);
      state.at("losses").toList().set(0, -100.0);
      state.at("names").toList().push_back(std::string("c"));
      state.at("counts").toList().push_back(int64_t(5));
      state.at("extras").toGenericDict().insert(std::string("late"), int64_t(1));
      ASSERT_NO_THROW(response.upload_completion.get());
      StateDict target = with_values();
      target.at("w").toTensor().zero_();
      load(target, dir.path());
      EXPECT_TRUE(torch::equal(target.at("w").toTensor().cpu(), torch::full({16}, 1.0f)));
      EXPECT_EQ(target.at("losses").toDoubleList().vec(), std::vector<double>({1, 2, 3}));
      EXPECT_EQ(target.at("names").toList().size(), 2u);
      EXPECT_EQ(target.at("counts").toList().size(), 0u);
      EXPECT_EQ(target.at("extras").toGenericDict().size(), 0u);
    }
  }
}

TEST(DcpAsyncSave, AnUndefinedTensorGetsSavesErrorOnEveryPath) {
  const std::string expected = "checkpoint entry 'undefined' is an undefined tensor";
  const auto expect_named = [&](const std::function<void()>& operation) {
    try {
      operation();
      ADD_FAILURE() << "expected an error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  StateDict state = filled(1, 2);
  state.insert("undefined", at::Tensor());
  const ScratchDir dir;
  expect_named([&] { save(state, dir.path()); });
  for (const StagerSetUp& set_up : stager_set_ups()) {
    SCOPED_TRACE(set_up.name);
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().cache_staged_state_dict(set_up.writer_caches));
    const std::unique_ptr<AsyncStager> stager = set_up.make();
    expect_named([&] { async_save(state, writer, stager.get()); });  // thrown at once
    EXPECT_FALSE(has_pending_save(writer));
    AsyncStager& direct = stager ? *stager : writer;
    expect_named([&] {
      if (auto future = direct.stage_in_background(SaveableState(state))) future->get();
      direct.stage(SaveableState(state));
    });
  }
  EXPECT_TRUE(testing::list_files(dir.path()).empty());
  // Load names the entry the same way.
  StateDict saved = filled(1, 2);
  saved.insert("undefined", torch::zeros({4}));
  save(saved, dir.path());
  StateDict target = filled(0, 2);
  target.insert("undefined", at::Tensor());
  try {
    load(target, dir.path());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("entry 'undefined' is an undefined tensor"), std::string::npos) << e.what();
  }
}

// A stager that reuses its buffers, shared by two writers: the second save must not
// overwrite the snapshot the first is still writing.
TEST(DcpAsyncSave, ACachingStagerSharedByTwoWritersKeepsEachSnapshot) {
  struct CachingSetUp {
    std::string name;
    std::function<std::unique_ptr<AsyncStager>(const std::string&)> make;
  };
  const std::vector<CachingSetUp> set_ups = {
      {"cached BlockingAsyncStager", [](const std::string&) { return std::make_unique<BlockingAsyncStager>(true); }},
      {"DefaultStager", [](const std::string&) { return std::make_unique<DefaultStager>(); }},
      {"synchronous DefaultStager",
       [](const std::string&) { return std::make_unique<DefaultStager>(StagingOptions(false, false, false, false)); }},
      {"a third, cached writer",
       [](const std::string& path) {
         return std::make_unique<FileSystemWriter>(path, FileSystemWriterOptions().cache_staged_state_dict(true));
       }},
  };
  for (const CachingSetUp& set_up : set_ups) {
    SCOPED_TRACE(set_up.name);
    const ScratchDir dir_a, dir_b, dir_c;
    const std::unique_ptr<AsyncStager> stager = set_up.make(dir_c.path());
    EXPECT_TRUE(stager->reuses_buffers());
    HeldWriter writer_a(dir_a.path());
    FileSystemWriter writer_b(dir_b.path());
    // One source, as in training: a DefaultStager keeps its buffers per source storage.
    StateDict state = filled(1);
    AsyncSaveResponse first = async_save(state, writer_a, stager.get());
    first.staging_completion.get();
    for (int i = 0; i < 4; ++i) state.at("t" + std::to_string(i)).toTensor().fill_(2);
    writer_a.reached.wait();  // the first tensor is written; the other three are not
    try {
      async_save(state, writer_b, stager.get(), AsyncSaveOptions().if_save_pending(PendingSave::kReject));
      ADD_FAILURE() << "expected the stager's save in flight to be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("stager"), std::string::npos) << e.what();
    }
    AsyncSaveResponse second;
    std::thread caller([&] { second = async_save(state, writer_b, stager.get()); });
    // Time for a stager that does not wait to overwrite the first snapshot.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    writer_a.release.open();
    caller.join();
    ASSERT_NO_THROW(first.upload_completion.get());
    ASSERT_NO_THROW(second.upload_completion.get());
    for (const auto& [dir, value] : {std::pair{&dir_a, 1.0f}, std::pair{&dir_b, 2.0f}}) {
      StateDict target = filled(0);
      load(target, dir->path());
      for (int i = 0; i < 4; ++i) {
        EXPECT_TRUE(torch::equal(target.at("t" + std::to_string(i)).toTensor().cpu(), torch::full({1024}, value)))
            << dir->path() << " t" << i;
      }
    }
  }
  EXPECT_FALSE(BlockingAsyncStager().reuses_buffers());
}

size_t open_descriptors() {
  return entries_in("/proc/self/fd");
}

size_t mappings() {
  std::ifstream maps("/proc/self/maps");
  return static_cast<size_t>(std::count(std::istreambuf_iterator<char>(maps), {}, '\n'));
}

// Lowers the soft limit on open descriptors for one scope.
class DescriptorLimit {
 public:
  explicit DescriptorLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = soft;
    ::setrlimit(RLIMIT_NOFILE, &lowered);
  }
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

TEST(DcpDefaultStager, TenThousandTensorsStageIntoAFewArenasUnderALowDescriptorLimit) {
  constexpr int kTensors = 10000;
  StateDict state;
  for (int i = 0; i < kTensors; ++i) state.insert("t" + std::to_string(i), torch::full({16}, float(i)));
  ASSERT_LT(open_descriptors(), 200u);
  const ScratchDir dir;
  const size_t descriptors_before = open_descriptors();
  const size_t mappings_before = mappings();
  const int64_t shared_before = memory::host_buffer_stats().shared_bytes;
  {
    DefaultStager stager;  // shared memory, as by default
    ASSERT_TRUE(stager.options().use_shared_memory());
    FileSystemWriter writer(dir.path());
    {
      const DescriptorLimit limit(256);
      ASSERT_NO_THROW(async_save(state, writer, &stager).upload_completion.get());
    }
    // The cache holds 10,000 buffers of 64 bytes: in one arena, one descriptor, one mapping.
    EXPECT_EQ(stager.cached_bytes(), kTensors * 64);
    EXPECT_LE(open_descriptors(), descriptors_before + 2);
    EXPECT_LE(mappings(), mappings_before + 64);  // thread stacks glibc keeps, and the like
    EXPECT_LE(memory::host_buffer_stats().shared_bytes - shared_before, kTensors * 64 + 4096);
  }
  EXPECT_EQ(open_descriptors(), descriptors_before);
  EXPECT_EQ(memory::host_buffer_stats().shared_bytes, shared_before);
  StateDict target;
  for (int i = 0; i < kTensors; ++i) target.insert("t" + std::to_string(i), torch::zeros({16}));
  load(target, dir.path());
  for (int i = 0; i < kTensors; i += 997) {
    EXPECT_TRUE(torch::equal(target.at("t" + std::to_string(i)).toTensor(), torch::full({16}, float(i)))) << i;
  }
}

// What TSan reported in DestructorsWaitAndLeaveNoThreads when a writer's destructor,
// not the response's, waited for the save: a DefaultStager closed (its cache freed)
// while a save still writes its snapshot. The snapshot holds its own
// references to the staged buffers, so the last reference is the writer's, dropped as
// each tensor is written: nothing is freed under the writer. Under ASan a buffer freed
// too early would fail here as a use after free; without it, as wrong bytes.
TEST(DcpAsyncSave, ClosingTheStagerWhileItsSnapshotIsWrittenKeepsTheSnapshot) {
  const ScratchDir dir;
  HeldWriter writer(dir.path());
  AsyncSaveResponse response;
  {
    DefaultStager stager(StagingOptions().use_shared_memory(false));
    response = async_save(filled(6, 4, 256 * 1024), writer, &stager);
    writer.reached.wait();
    stager.close();
    EXPECT_EQ(stager.cached_bytes(), 0);
  }
  // Reuse whatever memory was freed, with other bytes.
  std::vector<at::Tensor> filler;
  filler.reserve(8);
  for (int i = 0; i < 8; ++i) filler.push_back(memory::allocate_host({256 * 1024}, c10::kFloat).fill_(-7));
  writer.release.open();
  ASSERT_NO_THROW(response.upload_completion.get());
  StateDict target = filled(0, 4, 256 * 1024);
  load(target, dir.path());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::equal(target.at("t" + std::to_string(i)).toTensor(), torch::full({256 * 1024}, 6.0f))) << i;
  }
}

TEST(DcpAsyncSave, ASecondSaveOnTheSameWriterWaitsForTheFirst) {
  const ScratchDir dir;
  HeldWriter writer(dir.path(), FileSystemWriterOptions().cache_staged_state_dict(true));
  AsyncSaveResponse first = async_save(filled(1), writer);
  writer.reached.wait();
  EXPECT_TRUE(has_pending_save(writer));
  EXPECT_THROW(async_save(filled(2), writer, nullptr, AsyncSaveOptions().if_save_pending(PendingSave::kReject)), Error);

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

TEST(DcpAsyncSave, IntoADirectoryWithAWriterTheResponseOwns) {
  const ScratchDir dir;
  const at::Tensor w = torch::arange(1000, torch::kFloat);
  AsyncSaveResponse response = async_save(state_of({{"w", w}}), dir.sub("ckpt"));
  ASSERT_TRUE(response.owned_writer);
  response.upload_completion.get();
  StateDict loaded = state_of({{"w", torch::zeros({1000})}});
  load(loaded, dir.sub("ckpt"));
  EXPECT_TRUE(torch::equal(loaded.at("w").toTensor(), w));
}

TEST(DcpAsyncSave, AWriteErrorReachesTheUploadFuture) {
  struct BrokenWriter : FileSystemWriter {
    using FileSystemWriter::FileSystemWriter;
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
  EXPECT_FALSE(has_pending_save(writer));
}

TEST(DcpAsyncSave, DestructorsWaitAndLeaveNoThreads) {
  const size_t threads_before = thread_count();
  const ScratchDir dir;
  std::shared_future<Metadata> upload;
  {
    HeldWriter writer(dir.path());
    DefaultStager stager;
    const AsyncSaveResponse response = async_save(filled(4), writer, &stager);
    upload = response.upload_completion;
    writer.reached.wait();
    writer.release.open();
    // All three go out of scope with the save possibly still running: the response
    // first, whose destructor waits for the save.
  }
  EXPECT_EQ(upload.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(upload.get().save_id.empty());
  {
    DefaultStager stager;
    for (int i = 0; i < 3; ++i) stager.stage_in_background(SaveableState(filled(static_cast<float>(i))));
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
