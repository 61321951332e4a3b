#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/copy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace stowage {
namespace {

StateDict sample() {
  StateDict sd;
  sd.insert("w", torch::randn({4, 5}).t());  // non-contiguous
  sd.insert("scalar", torch::tensor(3.5));
  sd.insert("empty", torch::empty({0, 3}));
  sd.insert("half", torch::ones({7}, torch::kHalf));
  sd.insert("step", int64_t{3});
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(torch::arange(6, torch::kInt64));
  sd.insert("list", list);
  return sd;
}

TEST(CopyStateDict, CreateThenCopyGivesADecoupledSnapshot) {
  StateDict src = sample();
  StateDict staged = create_cpu_state_dict(src);
  copy_state_dict(src, staged);
  const FlatStateDict flat_src = flatten_state_dict(src);
  const FlatStateDict flat_staged = flatten_state_dict(staged);
  for (const FlatEntry& e : flat_staged.entries()) {
    const c10::IValue& original = flat_src.at(e.fqn).value;
    if (!e.value.isTensor()) {
      EXPECT_EQ(e.value, original) << e.fqn;
      continue;
    }
    const at::Tensor t = e.value.toTensor();
    EXPECT_TRUE(t.is_cpu() && t.is_contiguous()) << e.fqn;
    EXPECT_TRUE(t.equal(original.toTensor())) << e.fqn;
    if (t.numel() > 0) EXPECT_NE(t.data_ptr(), original.toTensor().data_ptr()) << e.fqn;
  }
  src.at("w").toTensor().add_(1);
  EXPECT_FALSE(staged.at("w").toTensor().equal(src.at("w").toTensor()));
}

TEST(CopyStateDict, NonTensorLeavesAreCopiedNotShared) {
  StateDict src;
  src.insert("losses", c10::List<double>({1, 2, 3}));
  src.insert("names", c10::List<std::string>({"a", "b"}));
  src.insert("empty_list", c10::impl::GenericList(c10::IntType::get()));
  src.insert("extras", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  src.insert("name", std::string("run"));
  StateDict created = create_cpu_state_dict(src);
  StateDict copied = create_cpu_state_dict(src);
  copy_state_dict(src, copied);
  // Change every mutable leaf of the source in place.
  src.at("losses").toList().set(0, -100.0);
  src.at("names").toList().push_back(std::string("c"));
  src.at("empty_list").toList().push_back(int64_t(7));
  src.at("extras").toGenericDict().insert(std::string("late"), int64_t(1));
  for (const StateDict* snapshot : {&created, &copied}) {
    EXPECT_EQ(snapshot->at("losses").toDoubleList().vec(), std::vector<double>({1, 2, 3}));
    EXPECT_EQ(snapshot->at("losses").toList().elementType()->str(), "float");
    EXPECT_EQ(snapshot->at("names").toList().size(), 2u);
    EXPECT_EQ(snapshot->at("empty_list").toList().size(), 0u);
    EXPECT_EQ(snapshot->at("extras").toGenericDict().size(), 0u);
    EXPECT_EQ(snapshot->at("name").toStringRef(), "run");
  }
}

TEST(CopyStateDict, RepeatedCopiesReuseTheSameBuffers) {
  StateDict src = sample();
  StateDict staged = create_cpu_state_dict(src);
  copy_state_dict(src, staged);
  void* before = staged.at("w").toTensor().data_ptr();
  src.at("w").toTensor().mul_(2);
  src.insert_or_assign("step", int64_t{4});
  copy_state_dict(src, staged);
  EXPECT_EQ(staged.at("w").toTensor().data_ptr(), before);
  EXPECT_TRUE(staged.at("w").toTensor().equal(src.at("w").toTensor()));
  EXPECT_EQ(staged.at("step").toInt(), 4);
}

TEST(CopyStateDict, PinnedRequestFallsBackWhereTheBuildCannotPin) {
  StateDict src = sample();
  StateDict staged = create_cpu_state_dict(src, {/*pin_memory=*/true, /*share_memory=*/false});
  EXPECT_EQ(memory::is_pinned(staged.at("w").toTensor()), memory::can_pin_memory());
  copy_state_dict(src, staged);
  EXPECT_TRUE(staged.at("w").toTensor().equal(src.at("w").toTensor()));
}

void expect_rejected_unchanged(const StateDict& src, StateDict& dst, const std::string& culprit,
                               bool type_check = true) {
  const at::Tensor w_before = dst.at("w").toTensor().clone();
  try {
    copy_state_dict(src, dst, false, type_check);
    FAIL() << "expected an error naming " << culprit;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dst.at("w").toTensor().equal(w_before));
}

TEST(CopyStateDict, MismatchesAreRejectedBeforeAnyCopy) {
  StateDict src = sample();
  StateDict dst = create_cpu_state_dict(src);
  dst.at("w").toTensor().zero_();

  StateDict shape = sample();
  shape.insert_or_assign("half", torch::ones({8}, torch::kHalf));
  expect_rejected_unchanged(shape, dst, "'half'");

  StateDict dtype = sample();
  dtype.insert_or_assign("half", torch::ones({7}, torch::kFloat));
  expect_rejected_unchanged(dtype, dst, "'half'");

  StateDict missing = sample();
  missing.erase("step");
  expect_rejected_unchanged(missing, dst, "'step'");

  StateDict extra = sample();
  extra.insert("other", torch::ones({1}));
  expect_rejected_unchanged(extra, dst, "'other'");

  StateDict kind = sample();
  kind.insert_or_assign("step", 3.0);
  expect_rejected_unchanged(kind, dst, "'step'");
  copy_state_dict(kind, dst, false, /*type_check=*/false);
  EXPECT_EQ(dst.at("step").toDouble(), 3.0);
}

TEST(CopyStateDict, SharedMemoryBuffersHoldTheData) {
  StateDict src = sample();
  StateDict staged = create_cpu_state_dict(src, {false, /*share_memory=*/true});
  const int64_t shared_before = memory::host_buffer_stats().shared_bytes;
  EXPECT_GT(shared_before, 0);
  copy_state_dict(src, staged);
  EXPECT_TRUE(staged.at("w").toTensor().equal(src.at("w").toTensor()));
  staged = StateDict();
  EXPECT_LT(memory::host_buffer_stats().shared_bytes, shared_before);
}

}  // namespace
}  // namespace stowage
