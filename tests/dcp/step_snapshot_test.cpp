// A checkpoint is the state of exactly the step saved: what the next forward writes (a
// BatchNorm's running statistics and counter) is copied before async_save returns, while
// the rest is staged in the background as that forward runs.

#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/state/stateful.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <future>
#include <thread>
#include <utility>
#include <vector>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;

// Stages in the background only once the test opens the gate: the caller's next steps
// then run before the snapshot is taken, as they may under load.
class GatedStager final : public AsyncStager {
 public:
  std::optional<std::shared_future<SaveableState>> stage_in_background(const SaveableState& state) override {
    return std::async(std::launch::async,
                      [opened = opened_, state] {
                        opened.wait();
                        return BlockingAsyncStager().stage(state);
                      })
        .share();
  }
  void open() { gate_.set_value(); }

 private:
  std::promise<void> gate_;
  std::shared_future<void> opened_ = gate_.get_future().share();
};

torch::nn::Sequential batch_norm_model() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU());
}

std::vector<at::Tensor> buffers_of(const torch::nn::Sequential& model) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& buffer : model->buffers()) copies.push_back(buffer.clone());
  return copies;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

// The model's buffers as a checkpoint of it holds them.
std::vector<at::Tensor> saved_buffers(const std::string& checkpoint) {
  torch::nn::Sequential loaded = batch_norm_model();
  StateDict state;
  state.insert("model", as_ivalue(loaded.ptr()));
  load(state, checkpoint);
  return buffers_of(loaded);
}

// Saves the model after one forward, runs a second forward before staging may begin, and
// returns the buffers the checkpoint holds, with those after the first and second forward.
struct BuffersSeen {
  std::vector<at::Tensor> saved, at_save, after_next_forward;
};
BuffersSeen save_then_forward(const std::string& checkpoint, AsyncSaveOptions options) {
  torch::nn::Sequential model = batch_norm_model();
  model->forward(torch::randn({16, 4}));
  BuffersSeen seen;
  seen.at_save = buffers_of(model);
  StateDict state;
  state.insert("model", as_ivalue(model.ptr()));
  GatedStager stager;
  const AsyncSaveResponse response = async_save(state, checkpoint, &stager, std::move(options));
  model->forward(torch::randn({16, 4}));  // the next step's forward
  seen.after_next_forward = buffers_of(model);
  stager.open();
  response.upload_completion.get();
  seen.saved = saved_buffers(checkpoint);
  return seen;
}

TEST(DcpStepSnapshot, AsyncSaveCopiesModuleBuffersBeforeItReturns) {
  const ScratchDir dir;
  const BuffersSeen seen = save_then_forward(dir.sub("on"), {});
  EXPECT_TRUE(all_equal(seen.saved, seen.at_save));
  ASSERT_FALSE(all_equal(seen.at_save, seen.after_next_forward));  // the forward does write them
}

// The same save with the copy switched off holds the next forward's buffers: what the
// test above would see without it.
TEST(DcpStepSnapshot, WithoutTheCopyTheCheckpointHoldsTheNextForwardsBuffers) {
  const ScratchDir dir;
  const BuffersSeen seen =
      save_then_forward(dir.sub("off"), AsyncSaveOptions().copy_forward_state_before_return(false));
  EXPECT_FALSE(all_equal(seen.saved, seen.at_save));
  EXPECT_TRUE(all_equal(seen.saved, seen.after_next_forward));
}

TEST(DcpStepSnapshot, EntriesNamedInTheOptionsAreCopiedBeforeItReturns) {
  const ScratchDir dir;
  for (const bool named : {true, false}) {
    SCOPED_TRACE(named);
    at::Tensor tokens_seen = torch::full({2}, 5.0);
    at::Tensor weight = torch::ones({4});
    StateDict loop;
    loop.insert("tokens_seen", tokens_seen);
    StateDict state;
    state.insert("loop", loop);
    state.insert("weight", weight);
    GatedStager stager;
    const std::string checkpoint = dir.sub(named ? "named" : "unnamed");
    const AsyncSaveResponse response = async_save(
        state, checkpoint, &stager,
        AsyncSaveOptions().copy_before_return(named ? std::vector<std::string>{"loop"} : std::vector<std::string>{}));
    tokens_seen.add_(1);
    stager.open();
    response.upload_completion.get();
    StateDict loaded;
    StateDict loaded_loop;
    loaded_loop.insert("tokens_seen", torch::zeros({2}));
    loaded.insert("loop", loaded_loop);
    loaded.insert("weight", torch::zeros({4}));
    load(loaded, checkpoint);
    EXPECT_TRUE(torch::equal(loaded_loop.at("tokens_seen").toTensor(), torch::full({2}, named ? 5.0 : 6.0)));
    EXPECT_TRUE(torch::equal(loaded.at("weight").toTensor(), weight));
    EXPECT_TRUE(torch::equal(loop.at("tokens_seen").toTensor(), tokens_seen));  // the caller's dict keeps its tensor
  }
}

// The loop of checkpoint_manager.h on a model of residual Linear -> BatchNorm1d -> ReLU
// blocks with AdamW.
class Training {
 public:
  Training() {
    torch::manual_seed(11);
    for (int i = 0; i < 6; ++i) {
      blocks_->push_back(
          torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::BatchNorm1d(32), torch::nn::ReLU()));
    }
    optimizer_ = std::make_shared<torch::optim::AdamW>(blocks_->parameters(), torch::optim::AdamWOptions(1e-2));
    state_.insert("model", as_ivalue(blocks_.ptr()));
    state_.insert("optim", as_ivalue(optimizer_));
  }

  void step(int64_t step, CheckpointManager* manager) {
    at::Tensor x = torch::sin(torch::arange(16 * 32, torch::kFloat).reshape({16, 32}) * (0.01 * double(step)));
    for (const auto& block : *blocks_) x = x + block->as<torch::nn::Sequential>()->forward(x);
    x.pow(2).mean().backward();
    if (manager != nullptr) manager->wait_for_staging();
    optimizer_->step();
    optimizer_->zero_grad();
    if (manager != nullptr) manager->save(step, state_);
  }

  StateDict& state() { return state_; }

  // Every tensor of the model and the optimizer, flattened.
  FlatStateDict snapshot() {
    StateDict plain;
    plain.insert("model", ModuleState(blocks_.ptr()).state_dict());
    plain.insert("optim", OptimizerState(optimizer_).state_dict());
    return flatten_state_dict(deep_copy_structure(plain));
  }

 private:
  torch::nn::ModuleList blocks_;
  std::shared_ptr<torch::optim::AdamW> optimizer_;
  StateDict state_;
};

// The entries where two snapshots differ.
std::vector<std::string> differences(const FlatStateDict& a, const FlatStateDict& b) {
  std::vector<std::string> differ;
  for (const FlatEntry& entry : a.entries()) {
    const FlatEntry* other = b.find(entry.fqn);
    if (other == nullptr || entry.value.isTensor() != other->value.isTensor() ||
        (entry.value.isTensor() && !torch::equal(entry.value.toTensor(), other->value.toTensor()))) {
      differ.push_back(entry.fqn);
    }
  }
  return differ;
}

// Keeps both cores busy while it lives, as a loaded machine would.
class BusyMachine {
 public:
  BusyMachine() {
    for (int i = 0; i < 2; ++i) {
      threads_.emplace_back([this] {
        volatile uint64_t sink = 0;
        while (!stop_.load()) sink = sink + 1;
      });
    }
  }
  ~BusyMachine() {
    stop_ = true;
    for (std::thread& thread : threads_) thread.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

TEST(DcpStepSnapshot, ResumedBatchNormTrainingIsBitIdenticalUnderLoad) {
  constexpr int64_t kSteps = 12;
  Training uninterrupted;
  for (int64_t step = 1; step <= kSteps; ++step) uninterrupted.step(step, nullptr);
  const FlatStateDict expected = uninterrupted.snapshot();

  for (int repetition = 0; repetition < 4; ++repetition) {
    SCOPED_TRACE(repetition);
    const ScratchDir dir;
    {
      const BusyMachine busy;
      Training stopped;  // saves at step 4 and 8, stops after step 6 or 10 with the save of 4 or 8 committed
      CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(4).keep_last(1));
      const int64_t last = repetition % 2 == 0 ? 6 : 10;
      for (int64_t step = 1; step <= last; ++step) stopped.step(step, &manager);
      manager.wait();
    }
    Training resumed;
    CheckpointManager manager(dir.path(), CheckpointManagerOptions().save_every(4).keep_last(1));
    const std::optional<int64_t> restored = manager.restore(resumed.state());
    ASSERT_EQ(restored, repetition % 2 == 0 ? 4 : 8);
    for (int64_t step = *restored + 1; step <= kSteps; ++step) resumed.step(step, &manager);
    manager.wait();
    EXPECT_THAT(differences(expected, resumed.snapshot()), ::testing::IsEmpty());
  }
}

}  // namespace
}  // namespace stowage::dcp
