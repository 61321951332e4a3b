// SaveableState: the one pass over a save's state (Statefuls resolved, shards unsharded,
// flattened, checked), and the snapshots a stager makes of it.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::state_of;

// Counts what a save asks of it; its forward writes "running".
class CountedStateful final : public Stateful {
 public:
  StateDict state_dict() override {
    ++state_dict_calls;
    return state_of({{"weight", torch::ones({2})}, {"running", torch::zeros({2})}});
  }
  void load_state_dict(const StateDict&) override {}
  std::vector<ObjectPath> entries_written_in_forward() override {
    ++forward_calls;
    return {ObjectPath{std::string("running")}};
  }
  int state_dict_calls = 0;
  int forward_calls = 0;
};

void expect_invalid_naming(const std::function<void()>& body, const std::string& part) {
  try {
    body();
    ADD_FAILURE() << "no InvalidArgument naming " << part;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(DcpSaveableState, ResolvesUnshardsAndFlattensInOnePass) {
  const auto counted = c10::make_intrusive<CountedStateful>();
  const StateDict state = state_of(
      {{"model", as_ivalue(counted)}, {"shard", sharded_tensor(torch::arange(3.0), {6}, {3})}, {"step", int64_t{7}}});
  const SaveableState saveable(state);
  EXPECT_EQ(counted->state_dict_calls, 1);
  EXPECT_EQ(counted->forward_calls, 1);
  std::vector<std::string> fqns;
  for (const FlatEntry& entry : saveable.leaves().entries()) fqns.push_back(entry.fqn);
  EXPECT_EQ(fqns, (std::vector<std::string>{"model.weight", "model.running", "shard", "step"}));
  EXPECT_TRUE(torch::equal(saveable.leaves().at("shard").value.toTensor(), torch::arange(3.0)));
  ASSERT_EQ(saveable.layouts().count("shard"), 1U);
  EXPECT_EQ(saveable.layouts().at("shard").global_shape, std::vector<int64_t>{6});
  EXPECT_EQ(saveable.layouts().at("shard").box.offsets, std::vector<int64_t>{3});
  EXPECT_EQ(saveable.written_in_forward(), std::unordered_set<std::string>{"model.running"});
}

TEST(DcpSaveableState, ASaveAndAnAsyncSaveAskEachStatefulOnce) {
  const ScratchDir dir;
  const auto counted = c10::make_intrusive<CountedStateful>();
  const StateDict state = state_of({{"model", as_ivalue(counted)}});
  save(state, dir.sub("sync"));
  EXPECT_EQ(counted->state_dict_calls, 1);
  EXPECT_EQ(counted->forward_calls, 1);
  async_save(state, dir.sub("async")).upload_completion.get();
  EXPECT_EQ(counted->state_dict_calls, 2);
  EXPECT_EQ(counted->forward_calls, 2);
}

// The planner's old check of each tensor, now made once, where the state is made.
TEST(DcpSaveableState, RefusesATensorASaveCannotWriteNamingIt) {
  expect_invalid_naming(
      [] {
        SaveableState(state_of({{"empty", at::Tensor()}}));
      },
      "checkpoint entry 'empty' is an undefined tensor");
  expect_invalid_naming(
      [] {
        SaveableState(state_of({{"sparse", torch::eye(3).to_sparse()}}));
      },
      "checkpoint entry 'sparse' is a Sparse tensor; only dense tensors can be saved");
  const at::Tensor quantized = at::quantize_per_tensor(torch::ones({2}), 0.1, 0, at::kQInt8);
  expect_invalid_naming(
      [&] {
        SaveableState(state_of({{"quantized", quantized}}));
      },
      "checkpoint entry 'quantized' is a quantized tensor");
}

TEST(DcpSaveableState, ASnapshotKeepsTheLayoutsAndMustMatchLeafForLeaf) {
  const SaveableState saveable(state_of({{"shard", sharded_tensor(torch::ones({2}), {4}, {2})}, {"step", 1.5}}));
  FlatStateDict copies;
  copies.add(FlatEntry{"shard", {std::string("shard")}, torch::full({2}, 3.0)});
  copies.add(FlatEntry{"step", {std::string("step")}, 1.5});
  const SaveableState snapshot = saveable.with_leaves(copies);
  EXPECT_TRUE(torch::equal(snapshot.leaves().at("shard").value.toTensor(), torch::full({2}, 3.0)));
  EXPECT_EQ(snapshot.layouts().at("shard").global_shape, std::vector<int64_t>{4});
  EXPECT_EQ(create_local_save_plan(snapshot, 0).items.at(0).box.offsets, std::vector<int64_t>{2});

  FlatStateDict missing;
  missing.add(FlatEntry{"shard", {std::string("shard")}, torch::ones({2})});
  expect_invalid_naming([&] { saveable.with_leaves(missing); },
                        "differs from it at leaf 1: nothing where the state has 'step' (Double)");
  FlatStateDict renamed;
  renamed.add(FlatEntry{"other", {std::string("other")}, torch::ones({2})});
  renamed.add(FlatEntry{"step", {std::string("step")}, 1.5});
  expect_invalid_naming([&] { saveable.with_leaves(renamed); },
                        "at leaf 0: 'other' (a tensor) where the state has 'shard' (a tensor)");
  FlatStateDict value_for_tensor;
  value_for_tensor.add(FlatEntry{"shard", {std::string("shard")}, 2.0});
  value_for_tensor.add(FlatEntry{"step", {std::string("step")}, 1.5});
  expect_invalid_naming([&] { saveable.with_leaves(value_for_tensor); },
                        "at leaf 0: 'shard' (Double) where the state has 'shard' (a tensor)");
  FlatStateDict undefined;
  undefined.add(FlatEntry{"shard", {std::string("shard")}, at::Tensor()});
  undefined.add(FlatEntry{"step", {std::string("step")}, 1.5});
  expect_invalid_naming([&] { saveable.with_leaves(undefined); }, "checkpoint entry 'shard' is an undefined tensor");
}

}  // namespace
}  // namespace stowage::dcp
