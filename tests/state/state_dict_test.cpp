#include <stowage/error.h>
#include <stowage/state/state_dict.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace stowage {
namespace {

c10::impl::GenericDict dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

StateDict nested() {
  StateDict sd;
  auto model = dict();
  model.insert("layers.0.weight", torch::ones({2, 3}));  // a key with dots
  model.insert("bias", torch::zeros({3}));
  sd.insert("model", model);
  c10::impl::GenericList tensors(c10::AnyType::get());
  tensors.push_back(torch::arange(4));
  auto inner = dict();
  inner.insert("x", torch::full({1}, 7.0));
  inner.insert("name", std::string("bütçe"));
  tensors.push_back(inner);
  sd.insert("list", tensors);
  sd.insert("step", int64_t{12});
  sd.insert("lr", 0.5);
  sd.insert("flag", true);
  sd.insert("none", c10::IValue());
  sd.insert("ints", c10::List<int64_t>({1, 2, 3}));
  sd.insert("empty", dict());
  return sd;
}

TEST(StateDict, FlattenNamesLeavesInOrder) {
  const FlatStateDict flat = flatten_state_dict(nested());
  std::vector<std::string> names;
  for (const auto& e : flat.entries()) names.push_back(e.fqn);
  EXPECT_EQ(names, (std::vector<std::string>{"model.layers.0.weight", "model.bias", "list.0", "list.1.x", "list.1.name",
                                             "step", "lr", "flag", "none", "ints", "empty"}));
  const FlatEntry& w = flat.at("model.layers.0.weight");
  ASSERT_EQ(w.path.size(), 2u);
  EXPECT_EQ(std::get<std::string>(w.path[1]), "layers.0.weight");
  EXPECT_EQ(std::get<int64_t>(flat.at("list.1.x").path[1]), 1);
  EXPECT_TRUE(flat.at("ints").value.isIntList());
}

TEST(StateDict, UnflattenRoundTripsNestedDictsAndLists) {
  const StateDict original = nested();
  const StateDict rebuilt = unflatten_state_dict(flatten_state_dict(original));
  ASSERT_EQ(rebuilt.size(), original.size());
  const auto model = rebuilt.at("model").toGenericDict();
  EXPECT_TRUE(model.at("layers.0.weight").toTensor().equal(torch::ones({2, 3})));
  const auto list = rebuilt.at("list").toList();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_TRUE(list.get(0).toTensor().equal(torch::arange(4)));
  EXPECT_EQ(list.get(1).toGenericDict().at("name").toStringRef(), "bütçe");
  EXPECT_EQ(rebuilt.at("step").toInt(), 12);
  EXPECT_EQ(rebuilt.at("lr").toDouble(), 0.5);
  EXPECT_TRUE(rebuilt.at("none").isNone());
  EXPECT_EQ(rebuilt.at("ints").toIntVector(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(rebuilt.at("empty").toGenericDict().size(), 0u);
  // The tensors are the same objects: flattening never copies data.
  EXPECT_TRUE(model.at("bias").toTensor().is_same(original.at("model").toGenericDict().at("bias").toTensor()));
}

TEST(StateDict, CollidingNamesAreRejectedNamingBothPaths) {
  StateDict sd;
  sd.insert("a.b", torch::ones({1}));
  auto a = dict();
  a.insert("b", torch::ones({1}));
  sd.insert("a", a);
  try {
    flatten_state_dict(sd);
    FAIL() << "expected a collision error";
  } catch (const InvalidArgument& e) {
    // The two paths as they differ, not the same dotted name twice.
    EXPECT_NE(std::string(e.what()).find(R"(entries ["a.b"] and ["a", "b"] both flatten to the name 'a.b')"),
              std::string::npos)
        << e.what();
  }
}

TEST(StateDict, UnsupportedValuesAreRejectedNamingThePath) {
  StateDict sd;
  auto inner = dict();
  inner.insert("pair", c10::ivalue::Tuple::create({c10::IValue(1), c10::IValue(2)}));
  sd.insert("outer", inner);
  try {
    flatten_state_dict(sd);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'outer.pair'"), std::string::npos) << e.what();
  }
}

TEST(StateDict, NonStringKeysAreRejected) {
  StateDict sd;
  c10::impl::GenericDict by_int(c10::IntType::get(), c10::AnyType::get());
  by_int.insert(int64_t{0}, torch::ones({1}));
  sd.insert("state", by_int);
  EXPECT_THROW(flatten_state_dict(sd), InvalidArgument);
}

TEST(StateDict, UnflattenRejectsContradictoryPaths) {
  FlatStateDict flat;
  flat.add({"a", {std::string("a")}, torch::ones({1})});
  flat.add({"a.b", {std::string("a"), std::string("b")}, torch::ones({1})});
  EXPECT_THROW(unflatten_state_dict(flat), InvalidArgument);

  FlatStateDict gap;
  gap.add({"l.1", {std::string("l"), int64_t{1}}, torch::ones({1})});
  EXPECT_THROW(unflatten_state_dict(gap), InvalidArgument);

  FlatStateDict mixed;
  mixed.add({"m.0", {std::string("m"), int64_t{0}}, torch::ones({1})});
  mixed.add({"m.k", {std::string("m"), std::string("k")}, torch::ones({1})});
  EXPECT_THROW(unflatten_state_dict(mixed), InvalidArgument);
}

TEST(StateDict, DeepCopyStructureIsIndependentButSharesTensors) {
  StateDict sd = nested();
  StateDict copy = deep_copy_structure(sd);
  copy.at("model").toGenericDict().insert("extra", torch::ones({1}));
  EXPECT_FALSE(sd.at("model").toGenericDict().contains("extra"));
  EXPECT_TRUE(copy.at("model").toGenericDict().at("bias").toTensor().is_same(
      sd.at("model").toGenericDict().at("bias").toTensor()));
}

TEST(StateDict, MovingHandsTheEntriesOverAndLeavesNoReference) {
  StateDict source;
  source.insert("t", torch::ones({4}));
  const at::Tensor probe = source.at("t").toTensor();
  const auto holders = probe.use_count();
  StateDict moved(std::move(source));
  EXPECT_TRUE(source.empty());  // NOLINT: moved-from is specified as empty
  EXPECT_EQ(probe.use_count(), holders);
  StateDict assigned;
  assigned = std::move(moved);
  EXPECT_TRUE(moved.empty());  // NOLINT
  EXPECT_TRUE(assigned.at("t").toTensor().is_same(probe));
  assigned = StateDict();
  EXPECT_EQ(probe.use_count(), holders - 1);
}

}  // namespace
}  // namespace stowage
