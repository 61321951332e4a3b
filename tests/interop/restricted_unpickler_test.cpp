// The restricted unpickler under TorchDcpReader (src/interop/restricted_unpickler.h) on
// hand-written pickles: the values it decodes, and the inputs it refuses by name.

#include "interop/literal_bytes.h"
#include "interop/restricted_unpickler.h"

#include <stowage/error.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp {
namespace {

using testing::bytes_of;

detail::PickleRef unpickle(const std::string& bytes) {
  detail::UnpicklerOptions options;
  options.origin = "test pickle";
  return detail::unpickle(bytes, options);
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CorruptionError& e) {
    return e.what();
  }
  return "no error";
}

TEST(TorchDcpUnpickler, DecodesPlainValues) {
  // pickle.dumps({'a': [1, -2, 2**40], 'b': (1.5, None, True), 'c': 'x'}, protocol=4)
  const std::string bytes = bytes_of(
      "\x80\x04\x95\x2d\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
      "a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8a\x06\x00\x00"
      "\x00\x00\x00\x01"
      "e\x8c\x01"
      "b\x94G?\xf8\x00\x00\x00\x00\x00\x00N\x88\x87\x94\x8c\x01"
      "c\x94\x8c\x01x\x94u.");
  const detail::PickleRef value = unpickle(bytes);
  ASSERT_TRUE(value->is(detail::PickleValue::Kind::kDict));
  const detail::PickleValue* a = value->find("a");
  ASSERT_TRUE(a != nullptr && a->items.size() == 3);
  EXPECT_EQ(a->items[1]->integer, -2);
  EXPECT_EQ(a->items[2]->integer, int64_t(1) << 40);
  const detail::PickleValue* b = value->find("b");
  ASSERT_TRUE(b != nullptr && b->items.size() == 3);
  EXPECT_EQ(b->items[0]->floating, 1.5);
  EXPECT_EQ(value->find("c")->text, "x");
}

TEST(TorchDcpUnpickler, RefusesCyclesAndDeepNesting) {
  // EMPTY_LIST MEMOIZE BINGET 0 APPEND: a list inside itself.
  EXPECT_NE(error_of([] {
              unpickle(
                  bytes_of("\x80\x04]\x94h\x00"
                           "a."));
            }).find("put into itself"),
            std::string::npos);
  std::string deep = "\x80\x04";
  for (int i = 0; i < 100; ++i) deep += ']';
  for (int i = 0; i < 99; ++i) deep += 'a';
  deep += '.';
  EXPECT_NE(error_of([&] { unpickle(deep); }).find("nest deeper"), std::string::npos);
  // A container changed after it was put into another one.
  EXPECT_NE(error_of([] {
              unpickle(
                  bytes_of("\x80\x04]\x94]h\x00"
                           "a\x94h\x00N"
                           "a0."));
            }).find("changed after"),
            std::string::npos);
}

// Each value built counts against the budget, so that memory stays a bounded multiple
// of the input's size.
TEST(TorchDcpUnpickler, RefusesMoreValuesThanItsBudget) {
  detail::UnpicklerOptions options;
  options.origin = "test pickle";
  options.max_values = 100;
  std::string many = bytes_of("\x80\x04(");
  for (int i = 0; i < 1000; ++i) many += '}';  // EMPTY_DICT
  many += "l.";
  EXPECT_NE(error_of([&] { detail::unpickle(many, options); }).find("it builds more than 100 values"),
            std::string::npos);
  // Arguments copied out of a memoized tuple count too: (1, 2) is applied 60 times.
  static const std::vector<detail::AllowedGlobal> globals = {{"torch", "Size", detail::GlobalUse::kCallable}};
  options.globals = &globals;
  std::string calls = bytes_of("\x80\x04(\x8c\x05torch\x8c\x04Size\x93\x94K\x01K\x02\x86\x94R");
  for (int i = 0; i < 60; ++i) calls += bytes_of("h\x00h\x01R");
  calls += "l.";
  EXPECT_NE(error_of([&] { detail::unpickle(calls, options); }).find("it builds more than 100 values"),
            std::string::npos);
  options.max_values = -1;  // the default: one a byte, and more
  EXPECT_EQ(error_of([&] { detail::unpickle(many, options); }), "no error");
  EXPECT_EQ(error_of([&] { detail::unpickle(calls, options); }), "no error");
}

// REDUCE copies its arguments: a memoized argument tuple fetched again is intact.
TEST(TorchDcpUnpickler, ReduceLeavesAMemoizedArgumentTupleIntact) {
  static const std::vector<detail::AllowedGlobal> globals = {{"torch", "Size", detail::GlobalUse::kCallable}};
  detail::UnpicklerOptions options;
  options.origin = "test pickle";
  options.globals = &globals;
  // (torch.Size((1, 2)), (1, 2)) with the tuple memoized and fetched by BINGET.
  const detail::PickleRef value = detail::unpickle(bytes_of("\x80\x04\x8c\x05torch\x8c\x04Size\x93K\x01K\x02\x86\x94R"
                                                            "h\x00\x86."),
                                                   options);
  ASSERT_TRUE(value->is(detail::PickleValue::Kind::kTuple));
  ASSERT_EQ(value->items.size(), 2u);
  const detail::PickleValue& call = *value->items[0];
  ASSERT_TRUE(call.is(detail::PickleValue::Kind::kCall));
  ASSERT_EQ(call.items.size(), 2u);
  EXPECT_EQ(call.items[1]->integer, 2);
  const detail::PickleValue& args = *value->items[1];
  ASSERT_TRUE(args.is(detail::PickleValue::Kind::kTuple));
  ASSERT_EQ(args.items.size(), 2u);
  EXPECT_EQ(args.items[0]->integer, 1);
  EXPECT_EQ(args.items[1]->integer, 2);
}

TEST(TorchDcpUnpickler, RefusesTrailingBytesAndMissingMemo) {
  EXPECT_NE(error_of([] { unpickle(bytes_of("\x80\x04N.N")); }).find("follow STOP"), std::string::npos);
  EXPECT_NE(error_of([] { unpickle(bytes_of("\x80\x04h\x07.")); }).find("memo entry 7"), std::string::npos);
}

}  // namespace
}  // namespace stowage::dcp
