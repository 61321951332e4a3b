// Seed 000: the eight DCP staging cases, ported under their original names. They run
// on the build's device (test_device(): a GPU, else the simulated device sim:0 on
// LibTorch 2.x, else the CPU).

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <gtest/gtest.h>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::test_device;

StateDict nested_state(const c10::Device& device) {
  StateDict inner;
  inner.insert("bias", torch::ones({3}).to(device));
  StateDict state;
  state.insert("weight", torch::arange(12, torch::kFloat32).reshape({3, 4}).to(device));
  state.insert("inner", inner);
  return state;
}

TEST(DcpSeed000, test_async_stager_protocol_defaults) {
  // The smallest stager: it overrides nothing.
  struct MinimalStager : AsyncStager {};
  MinimalStager stager;
  AsyncStager& protocol = stager;
  EXPECT_TRUE(protocol.should_synchronize_after_execute());
  StateDict state;
  state.insert("x", torch::ones({2}));
  EXPECT_THROW(protocol.stage(SaveableState(state)), NotImplemented);
  EXPECT_FALSE(protocol.stage_in_background(SaveableState(state)).has_value());
  protocol.synchronize_staging();  // returns nothing, does nothing
  protocol.close();
}

TEST(DcpSeed000, test_blocking_async_stager_stage_npu_tensor_to_cpu_snapshot) {
  const c10::Device device = test_device();
  StateDict state = nested_state(device);
  BlockingAsyncStager stager;
  StateDict staged = stager.stage(SaveableState(state)).state_dict();

  const at::Tensor weight = staged.at("weight").toTensor();
  const at::Tensor bias = StateDict(staged.at("inner").toGenericDict()).at("bias").toTensor();
  EXPECT_TRUE(weight.device().is_cpu());
  EXPECT_TRUE(bias.device().is_cpu());
  EXPECT_TRUE(torch::equal(weight, torch::arange(12, torch::kFloat32).reshape({3, 4})));
  EXPECT_TRUE(torch::equal(bias, torch::ones({3})));

  // Later changes to the source never reach the snapshot, also for CPU sources.
  state.at("weight").toTensor().add_(100);
  StateDict(state.at("inner").toGenericDict()).at("bias").toTensor().fill_(-1);
  EXPECT_TRUE(torch::equal(weight, torch::arange(12, torch::kFloat32).reshape({3, 4})));
  EXPECT_TRUE(torch::equal(bias, torch::ones({3})));
}

TEST(DcpSeed000, test_blocking_async_stager_cached_reuses_cpu_buffer) {
  const c10::Device device = test_device();
  BlockingAsyncStager stager(/*cache_staged_state_dict=*/true);
  StateDict first;
  first.insert("w", torch::arange(6, torch::kFloat32).to(device));
  StateDict second;
  second.insert("w", torch::full({6}, 7.0f).to(device));

  const at::Tensor staged_first = stager.stage(SaveableState(first)).state_dict().at("w").toTensor();
  const void* buffer = staged_first.data_ptr();
  const at::Tensor staged_second = stager.stage(SaveableState(second)).state_dict().at("w").toTensor();
  EXPECT_EQ(staged_second.data_ptr(), buffer);
  EXPECT_TRUE(staged_second.device().is_cpu());
  EXPECT_TRUE(torch::equal(staged_second, torch::full({6}, 7.0f)));
}

TEST(DcpSeed000, test_blocking_async_stager_sync_noop_and_property) {
  BlockingAsyncStager stager;
  AsyncStager& protocol = stager;
  EXPECT_FALSE(protocol.should_synchronize_after_execute());
  protocol.synchronize_staging();
  EXPECT_FALSE(protocol.stage_in_background(SaveableState()).has_value());
}

TEST(DcpSeed000, test_filesystem_writer_stage_sets_copy_ahead_zero) {
  const ScratchDir dir;
  FileSystemWriter writer(dir.path(), FileSystemWriterOptions().per_thread_copy_ahead(1024));
  EXPECT_EQ(writer.options().per_thread_copy_ahead(), 1024);
  StateDict state;
  state.insert("t", torch::arange(5, torch::kFloat64).to(test_device()));
  const StateDict staged = writer.stage(SaveableState(state)).state_dict();
  EXPECT_EQ(writer.options().per_thread_copy_ahead(), 0);
  EXPECT_TRUE(staged.at("t").toTensor().device().is_cpu());
  EXPECT_TRUE(torch::equal(staged.at("t").toTensor(), torch::arange(5, torch::kFloat64)));
}

TEST(DcpSeed000, test_async_save_npu_state_dict_with_filesystem_writer) {
  const c10::Device device = test_device();
  for (const bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "cached" : "uncached");
    const ScratchDir dir;
    StateDict state = nested_state(device);
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().cache_staged_state_dict(cache));
    AsyncSaveResponse response = async_save(state, writer);
    response.upload_completion.get();

    StateDict target = nested_state(device);
    target.at("weight").toTensor().zero_();
    StateDict(target.at("inner").toGenericDict()).at("bias").toTensor().zero_();
    load(target, dir.path());
    EXPECT_TRUE(torch::equal(target.at("weight").toTensor(), state.at("weight").toTensor()));
    EXPECT_EQ(target.at("weight").toTensor().device(), device);
    EXPECT_TRUE(torch::equal(StateDict(target.at("inner").toGenericDict()).at("bias").toTensor(),
                             StateDict(state.at("inner").toGenericDict()).at("bias").toTensor()));
  }
}

// A user type that saves and restores itself through a state dict.
class Counter final : public Stateful {
 public:
  explicit Counter(c10::Device device) : values(torch::zeros({4}).to(device)) {}
  StateDict state_dict() override {
    StateDict state;
    state.insert("values", values);
    state.insert("steps", steps);
    return state;
  }
  void load_state_dict(const StateDict& state) override {
    values.copy_(state.at("values").toTensor());
    steps = state.at("steps").toInt();
  }
  at::Tensor values;
  int64_t steps = 0;
};

TEST(DcpSeed000, test_async_save_converts_stateful_object) {
  const c10::Device device = test_device();
  const ScratchDir dir;
  auto saved = c10::make_intrusive<Counter>(device);
  saved->values.copy_(torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}));
  saved->steps = 17;
  StateDict state;
  state.insert("counter", as_ivalue(saved));
  FileSystemWriter writer(dir.path());
  async_save(state, writer).upload_completion.get();

  auto restored = c10::make_intrusive<Counter>(device);
  StateDict target;
  target.insert("counter", as_ivalue(restored));
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(restored->values, saved->values));
  EXPECT_EQ(restored->steps, 17);
}

TEST(DcpSeed000, test_async_save_calls_synchronize_when_stager_requests_it) {
  struct SynchronizingWriter : FileSystemWriter {
    using FileSystemWriter::FileSystemWriter;
    bool should_synchronize_after_execute() const override { return true; }
    void synchronize_staging() override { synchronized = true; }
    bool synchronized = false;
  };
  const ScratchDir dir;
  SynchronizingWriter writer(dir.path());
  StateDict state;
  state.insert("x", torch::randn({8}).to(test_device()));
  AsyncSaveResponse response = async_save(state, writer);
  EXPECT_TRUE(writer.synchronized);
  const Metadata metadata = response.upload_completion.get();
  EXPECT_NE(metadata.find("x"), nullptr);
}

}  // namespace
}  // namespace stowage::dcp
