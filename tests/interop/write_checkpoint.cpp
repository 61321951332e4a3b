// Writes stowage checkpoints for the Python package's tests (python/tests/): every
// value is recomputable on the Python side, so the tests check what the C++ library
// wrote, byte for byte, without a file of expected values.
//
//   interop_write_checkpoint single DIR           one process: every dtype, a 0-dim, an
//                                                  empty, a non-contiguous and a
//                                                  multi-block tensor, nested dicts and
//                                                  lists, every kind of non-tensor value
//   interop_write_checkpoint single-per-chunk DIR  the same, one data file per chunk
//   interop_write_checkpoint sharded DIR          one rank of a save by the ranks of
//                                                  `stowage launch --nproc N` (torchrun's
//                                                  environment): tensors sharded over the
//                                                  ranks, replicated ones, values
//
// A tensor of shape S and dtype D holds deterministic_tensor(S, D): arange(numel) * 0.37 - 5
// in float64, reshaped to S and cast to D (+5 first for the unsigned Byte, so that no
// value is negative; complex: the imaginary part is the negated real part).
// python/tests/interop.py computes the same values.

#include <stowage/stowage.h>

#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <limits>
#include <string>

namespace dcp = stowage::dcp;

namespace {

torch::Tensor deterministic_tensor(const std::vector<int64_t>& shape, torch::Dtype dtype) {
  const int64_t numel = c10::multiply_integers(shape);
  torch::Tensor base = (torch::arange(numel, torch::kDouble) * 0.37 - 5).reshape(shape);
  if (dtype == torch::kByte) return (base + 5).to(dtype);
  if (c10::isComplexType(dtype)) return torch::complex(base, -base).to(dtype);
  return base.to(dtype);
}

// The dtypes of the format, by LibTorch name (the key their tensor is saved under).
const std::vector<std::pair<std::string, torch::Dtype>>& every_dtype() {
  static const std::vector<std::pair<std::string, torch::Dtype>> dtypes = {{"Byte", torch::kByte},
                                                                           {"Char", torch::kChar},
                                                                           {"Short", torch::kShort},
                                                                           {"Int", torch::kInt},
                                                                           {"Long", torch::kLong},
                                                                           {"Half", torch::kHalf},
                                                                           {"BFloat16", torch::kBFloat16},
                                                                           {"Float", torch::kFloat},
                                                                           {"Double", torch::kDouble},
                                                                           {"Bool", torch::kBool},
                                                                           {"ComplexHalf", torch::kComplexHalf},
                                                                           {"ComplexFloat", torch::kComplexFloat},
                                                                           {"ComplexDouble", torch::kComplexDouble}};
  return dtypes;
}

// Every kind of non-tensor leaf the format stores inline.
stowage::StateDict every_value() {
  stowage::StateDict values;
  values.insert("none", c10::IValue());
  values.insert("true", true);
  values.insert("false", false);
  values.insert("int_min", std::numeric_limits<int64_t>::min());
  values.insert("int_max", std::numeric_limits<int64_t>::max());
  values.insert("double", 0.1);
  values.insert("negative_zero", -0.0);
  values.insert("tiny", 5e-324);
  values.insert("huge", 1.7976931348623157e308);
  values.insert("third", 1.0 / 3.0);
  values.insert("exponent", 1e21);
  values.insert("nan", std::numeric_limits<double>::quiet_NaN());
  values.insert("inf", std::numeric_limits<double>::infinity());
  values.insert("minus_inf", -std::numeric_limits<double>::infinity());
  values.insert("str", std::string("h\xc3\xa9llo \"quoted\" \\ /\n\t\x01\x7f \xe2\x98\x83 \xf0\x9f\x90\x8d"));
  values.insert("empty_str", std::string());
  values.insert("empty_dict", c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
  values.insert("ints", c10::List<int64_t>({1, -2, 3}));
  values.insert("doubles", c10::List<double>({0.9, 0.999, -1e-7}));
  values.insert("bools", c10::List<bool>({true, false}));
  values.insert("strs", c10::List<std::string>({"a", "b.c"}));
  values.insert("empty_ints", c10::List<int64_t>());
  c10::impl::GenericList any(c10::AnyType::get());
  any.push_back(int64_t(1));
  any.push_back(std::string("two"));
  any.push_back(c10::IValue());
  any.push_back(2.5);
  any.push_back(false);
  values.insert("any", any);
  return values;
}

stowage::StateDict single_state() {
  stowage::StateDict dtypes;
  for (const auto& [name, dtype] : every_dtype()) dtypes.insert(name, deterministic_tensor({3, 4, 5}, dtype));
  stowage::StateDict tensors;
  tensors.insert("dtypes", dtypes);
  tensors.insert("zero_dim", deterministic_tensor({}, torch::kFloat));
  tensors.insert("empty", deterministic_tensor({0, 3}, torch::kFloat));
  tensors.insert("transposed", deterministic_tensor({4, 6}, torch::kDouble).t());  // not contiguous
  tensors.insert("big", deterministic_tensor({300, 1000}, torch::kFloat));         // five checksum blocks

  stowage::StateDict inner;
  inner.insert("weight", deterministic_tensor({2, 3}, torch::kFloat));
  stowage::StateDict nested;
  nested.insert("inner", inner);
  nested.insert("dotted.key", deterministic_tensor({2}, torch::kLong));  // its path is written
  nested.insert("k\xc3\xa9y \xe2\x98\x83", int64_t(7));                  // a non-ASCII key

  c10::impl::GenericList layers(c10::AnyType::get());  // a list of dicts: list indices in paths
  for (int i = 0; i < 2; ++i) {
    stowage::StateDict layer;
    layer.insert("w", deterministic_tensor({2, 2}, torch::kFloat));
    layer.insert("index", int64_t(i));
    layers.push_back(c10::IValue(layer));
  }
  c10::impl::GenericList mixed(c10::AnyType::get());  // a list holding a tensor and values
  mixed.push_back(deterministic_tensor({3}, torch::kHalf));
  mixed.push_back(int64_t(3));
  mixed.push_back(std::string("x"));

  stowage::StateDict state;
  state.insert("tensors", tensors);
  state.insert("nested", nested);
  state.insert("layers", layers);
  state.insert("mixed", mixed);
  state.insert("values", every_value());
  return state;
}

// The split of `size` into `world` parts, the first ones one longer (uneven shards).
std::pair<int64_t, int64_t> uneven_split(int64_t size, int64_t world, int64_t rank) {
  const int64_t base = size / world;
  const int64_t extra = size % world;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

// This rank's shard of deterministic_tensor(shape, dtype), split along `dim`.
c10::IValue shard(const std::vector<int64_t>& shape, torch::Dtype dtype, int64_t dim,
                  const stowage::dist::ProcessGroup& group) {
  const auto [offset, length] = uneven_split(shape[dim], group.size(), group.rank());
  std::vector<int64_t> offsets(shape.size(), 0);
  offsets[dim] = offset;
  return dcp::sharded_tensor(deterministic_tensor(shape, dtype).narrow(dim, offset, length).clone(), shape, offsets);
}

stowage::StateDict sharded_state(const stowage::dist::ProcessGroup& group) {
  c10::impl::GenericDict layer(c10::StringType::get(), c10::AnyType::get());
  layer.insert("weight", shard({11, 6}, torch::kFloat, 0, group));
  layer.insert("bias", deterministic_tensor({6}, torch::kFloat));  // replicated: written once
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  model.insert("layer", layer);
  model.insert("cols", shard({7, 9}, torch::kDouble, 1, group));
  model.insert("big", shard({600, 512}, torch::kFloat, 0, group));  // chunks of several checksum blocks
  model.insert("bf16", shard({5, 4}, torch::kBFloat16, 0, group));
  stowage::StateDict state;
  state.insert("model", model);
  state.insert("step", int64_t(42));
  return state;
}

int run(const std::string& command, const std::string& dir) {
  if (command == "single") {
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().thread_count(2));
    dcp::save(single_state(), writer);
  } else if (command == "single-per-chunk") {
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().single_file_per_rank(false));
    dcp::save(single_state(), writer);
  } else if (command == "sharded") {
    const stowage::dist::ProcessGroup group = stowage::dist::init_process_group_from_env();
    dcp::save(sharded_state(group), dir, group);
  } else {
    std::cerr << "unknown command '" << command << "' (single, single-per-chunk, sharded)\n";
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: interop_write_checkpoint single|single-per-chunk|sharded DIR\n";
    return 2;
  }
  try {
    return run(argv[1], argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "interop_write_checkpoint: " << e.what() << "\n";
    return 1;
  }
}
