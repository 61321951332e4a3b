// Round trips through save and load: every dtype, odd tensors, odd keys, values,
// Stateful objects, and the shape of what lands on disk.

#include "dcp/test_util.h"

#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

namespace stowage::dcp {
namespace {

using testing::ScratchDir;
using testing::state_of;
using testing::test_device;

// Bitwise equality, for every dtype (including those torch::equal lacks on the CPU).
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.resolve_conj().resolve_neg().cpu().contiguous();
  const at::Tensor y = b.resolve_conj().resolve_neg().cpu().contiguous();
  // memcmp of an empty tensor would pass null pointers (undefined behaviour, UBSan).
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

TEST(DcpSaveLoad, EveryDtypeRoundTrips) {
  const c10::Device device = test_device();
  const std::vector<c10::ScalarType> dtypes = {
      c10::kByte,  c10::kChar,   c10::kShort, c10::kInt,         c10::kLong,         c10::kHalf,         c10::kBFloat16,
      c10::kFloat, c10::kDouble, c10::kBool,  c10::kComplexHalf, c10::kComplexFloat, c10::kComplexDouble};
  StateDict state;
  StateDict target;
  for (c10::ScalarType dtype : dtypes) {
    const std::string key = c10::toString(dtype);
    const bool complex = c10::isComplexType(dtype);
    at::Tensor source = (torch::randn({5, 3}, complex ? torch::kComplexDouble : torch::kDouble) * 50).to(dtype);
    if (dtype == c10::kBool) source = torch::rand({5, 3}) > 0.5;
    state.insert(key, source.to(device));
    target.insert(key, torch::zeros({5, 3}, torch::TensorOptions().dtype(dtype).device(device)));
  }
  const ScratchDir dir;
  save(state, dir.path());
  load(target, dir.path());
  for (c10::ScalarType dtype : dtypes) {
    const std::string key = c10::toString(dtype);
    EXPECT_TRUE(same_bytes(target.at(key).toTensor(), state.at(key).toTensor())) << key;
  }
}

TEST(DcpSaveLoad, ZeroDimEmptyAndNonContiguousTensors) {
  const ScratchDir dir;
  const at::Tensor matrix = torch::arange(24, torch::kFloat32).reshape({4, 6});
  const at::Tensor complex = torch::randn({4}, torch::kComplexFloat);
  StateDict state = state_of({{"scalar", torch::tensor(3.5)},
                              {"empty", torch::empty({0, 7})},
                              {"transposed", matrix.t()},
                              {"strided", matrix.slice(1, 0, 6, 2)},
                              {"conjugated", complex.conj()},
                              {"negated", torch::randn({3})._neg_view()}});
  save(state, dir.path());

  // Destinations that are themselves non-contiguous views.
  const at::Tensor big = torch::zeros({6, 4});
  StateDict target = state_of({{"scalar", torch::tensor(0.0)},
                               {"empty", torch::empty({0, 7})},
                               {"transposed", big},
                               {"strided", torch::zeros({4, 6}).slice(1, 0, 6, 2)},
                               {"conjugated", torch::zeros({4}, torch::kComplexFloat)},
                               {"negated", torch::zeros({3})}});
  load(target, dir.path());
  for (const auto& item : state) {
    EXPECT_TRUE(same_bytes(target.at(item.key()).toTensor(), item.value().toTensor())) << item.key();
  }
  EXPECT_EQ(target.at("scalar").toTensor().dim(), 0);
}

TEST(DcpSaveLoad, ViewsSharingStorageSaveTheirOwnValues) {
  const ScratchDir dir;
  const at::Tensor base = torch::arange(10, torch::kFloat32);
  save(state_of({{"front", base.slice(0, 0, 5)}, {"back", base.slice(0, 5, 10)}, {"all", base}}), dir.path());
  const at::Tensor into = torch::zeros({10});
  StateDict target = state_of({{"front", into.slice(0, 0, 5)}, {"back", into.slice(0, 5, 10)}, {"all", into}});
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(into, base));
  EXPECT_TRUE(torch::equal(target.at("back").toTensor(), base.slice(0, 5, 10)));
}

TEST(DcpSaveLoad, KeysWithDotsAndNonAscii) {
  const ScratchDir dir;
  StateDict nested = state_of({{"c.d", torch::full({2}, 2.0f)}, {"重み", torch::full({2}, 3.0f)}});
  StateDict state = state_of({{"a.b", torch::full({2}, 1.0f)}, {"a", nested}, {"émoji 🙂", torch::full({1}, 4.0f)}});
  save(state, dir.path());
  StateDict target_nested = state_of({{"c.d", torch::zeros({2})}, {"重み", torch::zeros({2})}});
  StateDict target = state_of({{"a.b", torch::zeros({2})}, {"a", target_nested}, {"émoji 🙂", torch::zeros({1})}});
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(target.at("a.b").toTensor(), torch::full({2}, 1.0f)));
  EXPECT_TRUE(torch::equal(target_nested.at("c.d").toTensor(), torch::full({2}, 2.0f)));
  EXPECT_TRUE(torch::equal(target_nested.at("重み").toTensor(), torch::full({2}, 3.0f)));
  EXPECT_TRUE(torch::equal(target.at("émoji 🙂").toTensor(), torch::full({1}, 4.0f)));

  // Not UTF-8: rejected before anything is written, naming the key.
  const ScratchDir other;
  try {
    save(state_of({{std::string("bad\xff"), torch::zeros({1})}}), other.path());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(testing::data_files(other.path()).empty());
}

// An empty key has no place of its own in a dotted name ("" then "x" is "x"), so the
// metadata keeps such a path whole.
TEST(DcpSaveLoad, EmptyKeysRoundTripIntoTheSameStructure) {
  const auto nest = [](const std::string& key, const c10::IValue& value) { return state_of({{key, value}}); };
  const std::vector<std::pair<std::string, std::function<StateDict(const at::Tensor&)>>> shapes = {
      {"{'': {'x': t}}", [&](const at::Tensor& t) { return nest("", nest("x", t)); }},
      {"{'a': {'': t}}", [&](const at::Tensor& t) { return nest("a", nest("", t)); }},
      {"{'': {'': t}}", [&](const at::Tensor& t) { return nest("", nest("", t)); }},
  };
  for (const auto& [name, shape] : shapes) {
    SCOPED_TRACE(name);
    const ScratchDir dir;
    save(shape(torch::arange(4, torch::kFloat)), dir.path());
    const at::Tensor loaded = torch::zeros({4});
    StateDict target = shape(loaded);
    load(target, dir.path());
    EXPECT_TRUE(torch::equal(loaded, torch::arange(4, torch::kFloat)));
  }
  const ScratchDir dir;
  save(nest("", nest("x", torch::ones({2}))), dir.path());
  StateDict flat = state_of({{"x", torch::zeros({2})}});
  EXPECT_THROW(load(flat, dir.path()), InvalidArgument);
}

TEST(DcpSaveLoad, NonTensorValuesRoundTrip) {
  const ScratchDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StateDict state = state_of({{"int", int64_t(-7)},
                              {"big", std::numeric_limits<int64_t>::max()},
                              {"double", 0.1},
                              {"nan", nan},
                              {"inf", -std::numeric_limits<double>::infinity()},
                              {"bool", true},
                              {"string", std::string("héllo")},
                              {"none", c10::IValue()},
                              {"ints", c10::List<int64_t>({1, 2, 3})},
                              {"doubles", c10::List<double>({0.5, 1.5})},
                              {"empty_dict", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())},
                              {"empty_list", c10::List<int64_t>()}});
  save(state, dir.path());
  StateDict target = state_of({{"int", int64_t(0)},
                               {"big", int64_t(0)},
                               {"double", 0.0},
                               {"nan", 0.0},
                               {"inf", 0.0},
                               {"bool", false},
                               {"string", std::string()},
                               {"none", c10::IValue()},
                               {"ints", c10::List<int64_t>()},
                               {"doubles", c10::List<double>()},
                               {"empty_dict", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get())},
                               {"empty_list", c10::List<int64_t>()}});
  load(target, dir.path());
  EXPECT_EQ(target.at("int").toInt(), -7);
  EXPECT_EQ(target.at("big").toInt(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(target.at("double").toDouble(), 0.1);
  EXPECT_TRUE(std::isnan(target.at("nan").toDouble()));
  EXPECT_EQ(target.at("inf").toDouble(), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(target.at("bool").toBool());
  EXPECT_EQ(target.at("string").toStringRef(), "héllo");
  EXPECT_TRUE(target.at("none").isNone());
  EXPECT_EQ(target.at("ints").toIntVector(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(target.at("doubles").toDoubleVector(), (std::vector<double>{0.5, 1.5}));
  EXPECT_TRUE(target.at("empty_dict").isGenericDict());
  EXPECT_TRUE(target.at("empty_list").isIntList());
}

TEST(DcpSaveLoad, TenThousandSmallTensors) {
  const ScratchDir dir;
  StateDict state;
  StateDict target;
  for (int i = 0; i < 10000; ++i) {
    state.insert("layer." + std::to_string(i), torch::full({4}, static_cast<float>(i)));
    target.insert("layer." + std::to_string(i), torch::zeros({4}));
  }
  const Metadata metadata = save(state, dir.path());
  EXPECT_EQ(metadata.entries.size(), 10000u);
  EXPECT_EQ(testing::data_files(dir.path()).size(), 1u);
  load(target, dir.path());
  for (int i = 0; i < 10000; i += 997) {
    EXPECT_TRUE(torch::equal(target.at("layer." + std::to_string(i)).toTensor(), torch::full({4}, float(i))));
  }
  EXPECT_TRUE(torch::equal(target.at("layer.9999").toTensor(), torch::full({4}, 9999.0f)));
}

TEST(DcpSaveLoad, LayoutOnDiskFollowsTheOptions) {
  StateDict state;
  for (int i = 0; i < 7; ++i) state.insert("t" + std::to_string(i), torch::randn({100 + i * 37}));
  state.insert("step", int64_t(5));
  {
    const ScratchDir dir;
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().thread_count(3));
    const Metadata metadata = save(state, writer);
    EXPECT_EQ(testing::data_files(dir.path()).size(), 3u);
    for (const EntryMetadata& entry : metadata.entries) {
      for (const TensorChunk& chunk : entry.chunks) {
        EXPECT_EQ(chunk.location.offset % kChunkAlignment, 0) << entry.fqn;
        EXPECT_TRUE(is_safe_file_name(chunk.location.file));
        EXPECT_NE(chunk.location.file.find(metadata.save_id), std::string::npos);
      }
    }
    // The metadata on disk is the one save returned.
    const Metadata on_disk = decode_metadata(testing::read_file(testing::metadata_path(dir.path())), "test");
    EXPECT_EQ(on_disk.save_id, metadata.save_id);
    EXPECT_EQ(on_disk.find("step")->value.toInt(), 5);
    EXPECT_EQ(on_disk.find("t3")->chunks.at(0).location.checksum, metadata.find("t3")->chunks.at(0).location.checksum);
    StateDict target;
    for (int i = 0; i < 7; ++i) target.insert("t" + std::to_string(i), torch::zeros({100 + i * 37}));
    load(target, dir.path());
    for (int i = 0; i < 7; ++i) {
      EXPECT_TRUE(
          torch::equal(target.at("t" + std::to_string(i)).toTensor(), state.at("t" + std::to_string(i)).toTensor()));
    }
  }
  {
    const ScratchDir dir;
    FileSystemWriter writer(dir.path(), FileSystemWriterOptions().single_file_per_rank(false).sync_files(false));
    save(state, writer);
    EXPECT_EQ(testing::data_files(dir.path()).size(), 7u);
  }
  EXPECT_THROW(FileSystemWriter("x", FileSystemWriterOptions().thread_count(0)), InvalidArgument);
  EXPECT_THROW(FileSystemWriter("x", FileSystemWriterOptions().per_thread_copy_ahead(-1)), InvalidArgument);
}

torch::nn::Sequential small_relu_model() {
  return torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, int seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = torch::randn({16, 6});
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), x.sum(1, true).cos()).backward();
    optimizer.step();
  }
}

TEST(DcpSaveLoad, ModuleAndFreshAdamResumeExactly) {
  torch::manual_seed(0);
  auto model = small_relu_model();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  train(model, *optimizer, 5, 1);
  const ScratchDir dir;
  save(state_of({{"model", as_ivalue(model.ptr())}, {"optim", as_ivalue(optimizer)}, {"epoch", int64_t(3)}}),
       dir.path());

  // A fresh model and an optimizer that has no state yet: load materialises it.
  torch::manual_seed(99);
  auto resumed = small_relu_model();
  auto resumed_optimizer = std::make_shared<torch::optim::Adam>(resumed->parameters(), torch::optim::AdamOptions(1));
  ASSERT_TRUE(resumed_optimizer->state().empty());
  StateDict target =
      state_of({{"model", as_ivalue(resumed.ptr())}, {"optim", as_ivalue(resumed_optimizer)}, {"epoch", int64_t(0)}});
  load(target, dir.path());
  EXPECT_EQ(target.at("epoch").toInt(), 3);
  EXPECT_EQ(resumed_optimizer->state().size(), optimizer->state().size());
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamOptions&>(resumed_optimizer->param_groups()[0].options()).lr(), 1e-2);

  train(model, *optimizer, 5, 2);
  train(resumed, *resumed_optimizer, 5, 2);
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], resumed->parameters()[i])) << i;
  }
}

// The README's first snippet took a fresh optimizer's plain state dict, whose "state" is
// {}: a plain dict cannot gain the saved states, so the load says how to do it instead of
// naming 'optim.state' as missing or, with allow_partial_load, loading no state at all.
TEST(DcpSaveLoad, APlainOptimizerStateDictIsRefusedWithTheWayToRestoreIt) {
  torch::manual_seed(0);
  auto model = small_relu_model();
  auto optimizer = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  train(model, *optimizer, 2, 1);
  const ScratchDir dir;
  save(state_of({{"optim", as_ivalue(optimizer)}}), dir.path());

  auto fresh = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (const bool partial : {false, true}) {
    SCOPED_TRACE(partial);
    StateDict target = state_of({{"optim", OptimizerState(fresh).state_dict()}});
    try {
      load(target, dir.path(), LoadOptions().allow_partial_load(partial));
      ADD_FAILURE() << "loaded no optimizer state without a word";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("'optim.state' is an empty dict"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("as_ivalue(optimizer)"));
      EXPECT_THAT(e.what(), ::testing::Not(::testing::HasSubstr("is not in the checkpoint")));
    }
    EXPECT_TRUE(fresh->state().empty());
  }
  StateDict target = state_of({{"optim", as_ivalue(fresh)}});
  load(target, dir.path());
  EXPECT_EQ(fresh->state().size(), optimizer->state().size());
}

TEST(DcpSaveLoad, ALeafWhereTheCheckpointHasAContainerIsNamedAsSuch) {
  const ScratchDir dir;
  save(state_of({{"a", state_of({{"b", torch::ones({2})}})}}), dir.path());
  StateDict target = state_of({{"a", torch::zeros({2})}});
  for (const bool partial : {false, true}) {
    try {
      load(target, dir.path(), LoadOptions().allow_partial_load(partial));
      ADD_FAILURE() << "loaded a container into a tensor";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr("'a' is a Tensor in the state dict, but a container in the checkpoint"));
    }
  }
}

TEST(DcpSaveLoad, LoadsDirectlyIntoParametersThatRequireGrad) {
  const ScratchDir dir;
  save(state_of({{"w", torch::ones({3})}}), dir.path());
  const at::Tensor parameter = torch::zeros({3}, torch::requires_grad());
  StateDict target = state_of({{"w", parameter}});
  load(target, dir.path());
  EXPECT_TRUE(torch::equal(parameter.detach(), torch::ones({3})));
}

}  // namespace
}  // namespace stowage::dcp
