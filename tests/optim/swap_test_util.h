#pragma once

// Helpers of the swap optimizer tests: deterministic parameters and gradients, and exact
// comparisons of parameters and optimizer states.

#include <stowage/optim/master_adamw.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/state/stateful.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace stowage::optim::testing {

using Shapes = std::vector<std::vector<int64_t>>;

// Above SwapOptimizerConfig's default min_numel: a parameter of this many elements is swapped.
constexpr int64_t kSwappedNumel = 2048;

// A directory for the disk tier's scratch files, made once per test process under
// $TMPDIR (else /tmp) and removed at exit. The files unlink themselves: it stays empty.
inline const std::string& swap_test_dir() {
  struct Scratch {
    Scratch() {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/stowage-swap-test-XXXXXX";
      if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot make a directory " + pattern);
      path = pattern;
    }
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
    std::string path;
  };
  static const Scratch scratch;
  return scratch.path;
}

// How a test's swap optimizer keeps and moves its states: in host memory or on the disk
// tier (through io_uring or a thread pool), packed or one copy per tensor.
struct SwapMode {
  std::string name;
  bool packed = true;
  bool disk = false;
  SwapIoPath io_path = SwapIoPath::kAuto;

  SwapOptimizerConfig apply(SwapOptimizerConfig config) const {
    config.packed_swap(packed);
    if (disk) config.swap_dir(swap_test_dir()).io_path(io_path);
    return config;
  }
};

inline void PrintTo(const SwapMode& mode, std::ostream* os) {
  *os << mode.name;
}

inline std::vector<SwapMode> swap_modes() {
  return {
      {"Packed", true, false},
      {"PerTensor", false, false},
      {"DiskPackedIoUring", true, true, SwapIoPath::kIoUring},
      {"DiskPerTensorIoUring", false, true, SwapIoPath::kIoUring},
      {"DiskPackedThreads", true, true, SwapIoPath::kThreads},
      {"DiskPerTensorThreads", false, true, SwapIoPath::kThreads},
  };
}

inline std::string mode_name(const ::testing::TestParamInfo<SwapMode>& info) {
  return info.param.name;
}

// A plain AdamW over `params`, learning rate 1e-2 unless `options` says otherwise.
inline std::shared_ptr<torch::optim::AdamW> adamw(
    const std::vector<torch::Tensor>& params,
    const torch::optim::AdamWOptions& options = torch::optim::AdamWOptions(1e-2)) {
  return std::make_shared<torch::optim::AdamW>(params, options);
}

inline std::vector<torch::Tensor> make_params(const Shapes& shapes, torch::Dtype dtype = torch::kFloat,
                                              uint64_t seed = 7) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const auto& shape : shapes) params.push_back(torch::randn(shape).to(dtype).requires_grad_());
  return params;
}

inline std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// The same gradients for every copy of the parameters at a given step; `has_grad(i, step)`
// says which parameters get one.
inline void set_grads(std::vector<torch::Tensor>& params, int step,
                      const std::function<bool(size_t, int)>& has_grad = nullptr) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (has_grad && !has_grad(i, step)) {
      params[i].mutable_grad() = torch::Tensor();
      continue;
    }
    torch::manual_seed(1000 * step + i);
    params[i].mutable_grad() = torch::randn(params[i].sizes()).to(params[i].scalar_type());
  }
}

inline void expect_params_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  }
}

// Compares two state dicts of stowage::OptimizerState's layout exactly: step counts,
// tensor keys, dtypes and values, and the param groups' options.
inline void expect_state_dicts_equal(const StateDict& expected, const StateDict& actual) {
  const auto expected_state = expected.at("state").toGenericDict();
  const auto actual_state = actual.at("state").toGenericDict();
  ASSERT_EQ(expected_state.size(), actual_state.size());
  for (const auto& item : expected_state) {
    const std::string id = item.key().toStringRef();
    ASSERT_TRUE(actual_state.contains(id)) << "state " << id;
    const auto e = item.value().toGenericDict();
    const auto a = actual_state.at(id).toGenericDict();
    ASSERT_EQ(e.size(), a.size()) << "state " << id;
    for (const auto& field : e) {
      const std::string key = field.key().toStringRef();
      ASSERT_TRUE(a.contains(key)) << "state " << id << "." << key;
      if (field.value().isTensor()) {
        const auto& et = field.value().toTensor();
        const auto& at = a.at(key).toTensor();
        EXPECT_EQ(et.scalar_type(), at.scalar_type()) << id << "." << key;
        EXPECT_TRUE(torch::equal(et, at)) << "state " << id << "." << key;
      } else {
        EXPECT_EQ(field.value(), a.at(key)) << "state " << id << "." << key;
      }
    }
  }
  const auto eg = expected.at("param_groups").toList();
  const auto ag = actual.at("param_groups").toList();
  ASSERT_EQ(eg.size(), ag.size());
  for (size_t g = 0; g < eg.size(); ++g) {
    const auto e = eg.get(g).toGenericDict();
    const auto a = ag.get(g).toGenericDict();
    for (const char* key : {"lr", "eps", "weight_decay", "amsgrad"}) EXPECT_EQ(e.at(key), a.at(key)) << key;
    EXPECT_EQ(e.at("betas").toDoubleVector(), a.at("betas").toDoubleVector());
    EXPECT_EQ(e.at("params").toIntVector(), a.at("params").toIntVector());
  }
}

inline StateDict plain_state_dict(const std::shared_ptr<torch::optim::Optimizer>& optimizer) {
  return OptimizerState(optimizer).state_dict();
}

}  // namespace stowage::optim::testing
