// GradientReducer on groups of 1 to 3 ranks run as threads: the gradients after
// synchronize() are the mean of every rank's, with the overlap and without, in buckets
// of the cap, bit for bit what copying each gradient into a flat bucket gives; they are
// views of the buckets; with gradient owners each rank keeps only its own; misuse, bad
// parameters and parameters that change are refused by name; buffers become rank 0's.

#include "process_groups.h"
#include "test_device.h"

#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>
#include <vector>

namespace stowage::dist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A three-layer MLP's parameters (weights and biases), the same values on every call.
std::vector<at::Tensor> mlp_params() {
  std::vector<at::Tensor> params;
  const std::vector<std::pair<int64_t, int64_t>> layers = {{16, 32}, {32, 32}, {32, 4}};
  int64_t seed = 0;
  for (const auto& [in, out] : layers) {
    params.push_back((at::arange(in * out, at::kFloat).reshape({out, in}) * 0.37 + static_cast<double>(++seed)).sin());
    params.push_back((at::arange(out, at::kFloat) * 0.11 + static_cast<double>(++seed)).cos());
  }
  for (at::Tensor& p : params) p.requires_grad_();
  return params;
}

// The loss of rank `rank`'s slice of the data; `skip_last` leaves the last bias unused.
at::Tensor mlp_loss(const std::vector<at::Tensor>& params, int64_t rank, bool skip_last = false) {
  at::Tensor x = (at::arange(8 * 16, at::kFloat).reshape({8, 16}) * 0.05 + static_cast<double>(rank)).tanh();
  for (size_t layer = 0; layer < 3; ++layer) {
    x = at::matmul(x, params[2 * layer].t());
    if (!(skip_last && layer == 2)) x = x + params[2 * layer + 1];
    if (layer < 2) x = at::gelu(x);
  }
  return x.pow(2).sum();
}

// The mean over `ranks` of each parameter's gradient, computed one rank after another.
std::vector<at::Tensor> mean_gradients(int64_t ranks, bool skip_last = false) {
  std::vector<at::Tensor> params = mlp_params();
  for (int64_t rank = 0; rank < ranks; ++rank) mlp_loss(params, rank, skip_last).backward();
  std::vector<at::Tensor> means;
  means.reserve(params.size());
  for (const at::Tensor& p : params) {
    means.push_back(p.grad().defined() ? p.grad() / static_cast<double>(ranks) : at::zeros_like(p));
  }
  return means;
}

class GradientReducerRanks : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(GradientReducerRanks, GradientsBecomeTheMeanOverTheRanks) {
  // Not a structured binding: the lambda below uses overlap, and C++17 lets no lambda capture one.
  const int64_t ranks = std::get<0>(GetParam());
  const bool overlap = std::get<1>(GetParam());
  const std::vector<at::Tensor> expected = mean_gradients(ranks, /*skip_last=*/true);
  std::vector<std::vector<at::Tensor>> params;
  for (int64_t r = 0; r < ranks; ++r) params.push_back(mlp_params());
  stowage::testing::run_ranks(ranks, [&](const ProcessGroup& group) {
    std::vector<at::Tensor>& mine = params[static_cast<size_t>(group.rank())];
    // Small buckets, so that several are sent during backward.
    GradientReducer reducer(mine, group, GradientReducerOptions().bucket_cap_mb(2e-3).overlap(overlap));
    EXPECT_GT(reducer.buckets().size(), 2u);
    for (int step = 0; step < 2; ++step) {  // the reducer is ready again after each synchronize()
      for (at::Tensor& p : mine) p.mutable_grad() = at::Tensor();
      mlp_loss(mine, group.rank(), /*skip_last=*/true).backward();
      reducer.synchronize();
      for (size_t i = 0; i < mine.size(); ++i) {
        ASSERT_TRUE(mine[i].grad().defined()) << "parameter " << i;
        EXPECT_TRUE(at::allclose(mine[i].grad(), expected[i], 1e-5, 1e-6))
            << "rank " << group.rank() << " parameter " << i << " step " << step;
      }
    }
  });
}

// What a reducer that copies each gradient into a flat bucket gives (stowage's before
// the gradients became views of the buckets): per bucket, the gradients side by side,
// all-reduced on `group` and divided by the ranks.
std::vector<at::Tensor> copied_and_all_reduced(const std::vector<at::Tensor>& params,
                                               const std::vector<std::vector<size_t>>& buckets,
                                               const ProcessGroup& group) {
  std::vector<at::Tensor> means(params.size());
  for (const std::vector<size_t>& bucket : buckets) {
    std::vector<at::Tensor> flat;
    flat.reserve(bucket.size());
    for (const size_t i : bucket) flat.push_back(params[i].grad().reshape(-1));
    at::Tensor sum = at::cat(flat);
    group.all_reduce_sum(sum);
    sum.div_(static_cast<double>(group.size()));
    int64_t offset = 0;
    for (const size_t i : bucket) {
      means[i] = sum.narrow(0, offset, params[i].numel()).view(params[i].sizes());
      offset += params[i].numel();
    }
  }
  return means;
}

TEST_P(GradientReducerRanks, BitIdenticalToCopyingEachGradientIntoItsBucket) {
  const int64_t ranks = std::get<0>(GetParam());
  const bool overlap = std::get<1>(GetParam());
  stowage::testing::run_ranks(ranks, [&](const ProcessGroup& group) {
    for (const bool views : {true, false}) {
      SCOPED_TRACE(views ? "bucket views" : "copies");
      std::vector<at::Tensor> mine = mlp_params();
      std::vector<at::Tensor> reference = mlp_params();
      GradientReducer reducer(
          mine, group, GradientReducerOptions().bucket_cap_mb(3e-3).overlap(overlap).gradient_as_bucket_view(views));
      for (int step = 0; step < 2; ++step) {
        reducer.zero_grad();
        for (at::Tensor& p : reference) p.mutable_grad() = at::Tensor();
        mlp_loss(mine, group.rank() + step).backward();
        mlp_loss(reference, group.rank() + step).backward();
        reducer.synchronize();
        const std::vector<at::Tensor> expected = copied_and_all_reduced(reference, reducer.buckets(), group);
        for (size_t i = 0; i < mine.size(); ++i) {
          EXPECT_TRUE(mine[i].grad().equal(expected[i])) << "rank " << group.rank() << " parameter " << i;
          if (!views && i > 0) EXPECT_FALSE(mine[i].grad().is_alias_of(mine[i - 1].grad())) << "parameter " << i;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndOverlap, GradientReducerRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

TEST(GradientReducer, GradientsAreViewsOfTheBucketsFromStepToStep) {
  stowage::testing::run_ranks(2, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    params[0].mutable_grad() = at::full_like(params[0], 7.0);  // a gradient the caller had is kept
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(3e-3));
    EXPECT_TRUE(params[0].grad().equal(at::full_like(params[0], 7.0)));
    std::vector<const void*> storage;
    storage.reserve(params.size());
    for (const at::Tensor& p : params) storage.push_back(p.grad().data_ptr());
    // The parameters of a bucket share one storage, side by side.
    for (const std::vector<size_t>& bucket : reducer.buckets()) {
      for (size_t k = 1; k < bucket.size(); ++k) {
        const at::Tensor& grad = params[bucket[k]].grad();
        const at::Tensor& previous = params[bucket[k - 1]].grad();
        EXPECT_TRUE(grad.is_alias_of(previous)) << "parameter " << bucket[k];
        EXPECT_EQ(static_cast<const char*>(grad.data_ptr()),
                  static_cast<const char*>(previous.data_ptr()) + previous.nbytes());
      }
    }
    for (int step = 0; step < 2; ++step) {
      reducer.zero_grad();
      mlp_loss(params, group.rank()).backward();
      reducer.synchronize();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].grad().data_ptr(), storage[i]) << "parameter " << i << ": a copy, not the bucket";
    }
  });
}

// Each rank owns one half of the parameters; only the owner gets their mean.
TEST(GradientReducer, WithOwnersEachRankKeepsTheMeanOfItsOwnParametersOnly) {
  for (const int64_t ranks : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    const std::vector<at::Tensor> expected = mean_gradients(ranks, /*skip_last=*/true);
    stowage::testing::run_ranks(ranks, [&](const ProcessGroup& group) {
      std::vector<at::Tensor> mine = mlp_params();
      std::vector<at::Tensor> everyones = mlp_params();
      std::vector<int64_t> owners(mine.size());
      for (size_t i = 0; i < owners.size(); ++i) owners[i] = static_cast<int64_t>(i * ranks / owners.size());
      GradientReducer sharded(mine, group, GradientReducerOptions().bucket_cap_mb(3e-3).gradient_owners(owners));
      GradientReducer replicated(everyones, group, GradientReducerOptions().bucket_cap_mb(3e-3));
      // A bucket holds one owner's parameters.
      for (const std::vector<size_t>& bucket : sharded.buckets()) {
        for (const size_t i : bucket) EXPECT_EQ(owners[i], owners[bucket.front()]) << "parameter " << i;
      }
      for (int step = 0; step < 2; ++step) {
        sharded.zero_grad();
        replicated.zero_grad();
        mlp_loss(mine, group.rank(), /*skip_last=*/true).backward();
        mlp_loss(everyones, group.rank(), /*skip_last=*/true).backward();
        sharded.synchronize();
        replicated.synchronize();
        for (size_t i = 0; i < mine.size(); ++i) {
          if (owners[i] != group.rank()) {
            EXPECT_FALSE(mine[i].grad().defined()) << "rank " << group.rank() << " kept parameter " << i;
            continue;
          }
          ASSERT_TRUE(mine[i].grad().defined()) << "parameter " << i;
          EXPECT_TRUE(at::allclose(mine[i].grad(), expected[i], 1e-5, 1e-6)) << "parameter " << i;
          // Two ranks sum in the same order either way.
          if (ranks == 2) EXPECT_TRUE(mine[i].grad().equal(everyones[i].grad())) << "parameter " << i;
        }
      }
    });
  }
}

TEST(GradientReducer, AParameterWithoutAGradientThisStepCountsAsZeros) {
  stowage::testing::run_ranks(2, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(3e-3));
    mlp_loss(params, group.rank()).backward();
    reducer.synchronize();
    ASSERT_NE(params.back().grad().abs().sum().item<double>(), 0);
    // Reset rather than zeroed, as Module::zero_grad() does on LibTorch 2.x: the bucket
    // still holds the last step's mean.
    for (at::Tensor& p : params) p.mutable_grad().reset();
    mlp_loss(params, group.rank(), /*skip_last=*/true).backward();  // the last bias unused
    reducer.synchronize();
    EXPECT_TRUE(params.back().grad().equal(at::zeros_like(params.back())));
  });
}

// A Function whose backward gives `weight` no gradient: autograd calls its AccumulateGrad
// with none, and the reducer's hook fires all the same.
struct ScaleWithoutWeightGradient : torch::autograd::Function<ScaleWithoutWeightGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x, const at::Tensor& weight) {
    return x * weight.sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

TEST(GradientReducer, ANoneGradientAfterAResetCountsAsZerosNotTheLastStepsMean) {
  stowage::testing::run_ranks(2, [](const ProcessGroup& group) {
    const at::Tensor x = at::arange(4, at::kFloat).requires_grad_();
    const at::Tensor weight = at::ones({3}).requires_grad_();
    GradientReducer reducer({x, weight}, group, GradientReducerOptions().bucket_cap_mb(1e-5));  // one each
    (x * weight.sum()).sum().backward();
    reducer.synchronize();
    ASSERT_TRUE(weight.grad().equal(at::full({3}, 6.0)));
    for (const at::Tensor& p : {x, weight}) p.mutable_grad().reset();  // as Module::zero_grad() on 2.x
    ScaleWithoutWeightGradient::apply(x, weight).sum().backward();
    reducer.synchronize();
    EXPECT_TRUE(weight.grad().equal(at::zeros({3}))) << weight.grad();
    EXPECT_TRUE(x.grad().equal(at::ones({4})));
  });
}

// The gradients after synchronize() are the means of what backward accumulated, whatever
// the caller set .grad() to in between (GradientReducerOptions::overlap).
TEST(GradientReducer, AGradientReplacedAfterBackwardStillBecomesTheMean) {
  const std::vector<at::Tensor> expected = mean_gradients(2);
  stowage::testing::run_ranks(2, [&](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(3e-3));
    const void* bucket_storage = params[0].grad().data_ptr();
    mlp_loss(params, group.rank()).backward();
    params[0].mutable_grad() = at::full_like(params[0], 7.0);
    reducer.synchronize();
    EXPECT_TRUE(at::allclose(params[0].grad(), expected[0]));
    EXPECT_EQ(params[0].grad().data_ptr(), bucket_storage) << "not the bucket's view";
  });
}

TEST(GradientReducer, AParameterThatChangesShapeOrDeviceIsRefusedByName) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    GradientReducer reducer(params, group);
    {
      const at::NoGradGuard no_grad;
      params[3].set_data(at::zeros({5}));
    }
    for (const bool zeroing : {true, false}) {
      try {
        if (zeroing) {
          reducer.zero_grad();
        } else {
          reducer.synchronize();
        }
        ADD_FAILURE() << "accepted a parameter of another shape";
      } catch (const InvalidArgument& e) {
        EXPECT_THAT(e.what(), HasSubstr("parameter 3 changed from [32] Float on cpu to [5] Float on cpu"));
      }
    }
  });
}

TEST(GradientReducer, BucketsFillUpToTheCapFromTheLastParameter) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params;
    params.reserve(5);
    for (int i = 0; i < 5; ++i) params.push_back(at::zeros({256 * 1024}, at::kFloat).requires_grad_());  // 1 MiB
    const GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(2.5));
    EXPECT_THAT(reducer.buckets(), ElementsAre(ElementsAre(4, 3), ElementsAre(2, 1), ElementsAre(0)));
    const GradientReducer one_bucket(params, group);  // 25 MiB: everything
    EXPECT_THAT(one_bucket.buckets(), ElementsAre(ElementsAre(4, 3, 2, 1, 0)));
  });
}

TEST(GradientReducer, AGradientAfterItsBucketWasSentIsRefusedByName) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = {at::ones({4}).requires_grad_(), at::ones({4}).requires_grad_()};
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(1e-5));  // one each
    (params[0] * 2).sum().backward();
    (params[0] * 3 + params[1]).sum().backward();  // parameter 0 again, after its bucket left
    try {
      reducer.synchronize();
      ADD_FAILURE() << "averaged a partial gradient";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 0 got a gradient after its bucket was sent"));
    }
    // The next step is clean again.
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    (params[0] * 2 + params[1]).sum().backward();
    reducer.synchronize();
    EXPECT_TRUE(params[0].grad().equal(at::full({4}, 2.0)));
  });
}

TEST(GradientReducer, AGradientAfterItsBucketWasSentIsRefusedByNameWithOwnersToo) {
  stowage::testing::run_ranks(2, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = {at::ones({4}).requires_grad_(), at::ones({4}).requires_grad_()};
    GradientReducer reducer(params, group, GradientReducerOptions().gradient_owners({1, 0}));  // one bucket each
    (params[0] * 2).sum().backward();
    (params[0] * 3 + params[1]).sum().backward();
    try {
      reducer.synchronize();
      ADD_FAILURE() << "averaged a partial gradient";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 0 got a gradient after its bucket was sent"));
    }
    reducer.zero_grad();
    (params[0] * 2 + params[1]).sum().backward();
    reducer.synchronize();
    EXPECT_TRUE(params[group.rank() == 1 ? 0 : 1].grad().equal(at::full({4}, group.rank() == 1 ? 2.0 : 1.0)));
    EXPECT_FALSE(params[group.rank() == 1 ? 1 : 0].grad().defined());
  });
}

// Only rank 1 uses parameter 0 in a second backward; rank 0's bucket was reduced with
// rank 1's partial gradient, so both must refuse the step.
TEST(GradientReducer, AGradientAfterItsBucketWasSentOnOneRankIsRefusedOnEvery) {
  stowage::testing::run_ranks(2, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = {at::ones({4}).requires_grad_(), at::ones({4}).requires_grad_()};
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(1e-5));  // one each
    (params[0] * 2 + params[1]).sum().backward();                                          // both buckets sent
    if (group.rank() == 1) (params[0] * 3).sum().backward();
    try {
      reducer.synchronize();
      ADD_FAILURE() << "rank " << group.rank() << " kept a gradient reduced with a partial one";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 0 got a gradient after its bucket was sent, on rank 1"));
    }
  });
}

TEST(GradientReducer, ABackwardWithCreateGraphIsRefusedByName) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    GradientReducer reducer(params, group);
    mlp_loss(params, 0).backward({}, /*retain_graph=*/true, /*create_graph=*/true);
    try {
      reducer.synchronize();
      ADD_FAILURE() << "detached gradients that had a graph";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("from a backward with create_graph=true, on rank 0"));
    }
  });
}

// set_data to another dtype and back (a Module::to round trip) gives a parameter a new
// AccumulateGrad node: the reducer follows it, before or after zero_grad().
TEST(GradientReducer, ParametersThatGetANewGradAccumulatorAreStillReduced) {
  const std::vector<at::Tensor> expected = mean_gradients(2);
  stowage::testing::run_ranks(2, [&](const ProcessGroup& group) {
    std::vector<at::Tensor> params = mlp_params();
    GradientReducer reducer(params, group, GradientReducerOptions().bucket_cap_mb(3e-3));
    const auto round_trip = [&] {
      const at::NoGradGuard no_grad;
      params[3].set_data(params[3].to(at::kDouble));
      params[3].set_data(params[3].to(at::kFloat));
    };
    for (const bool before_zero_grad : {true, false}) {
      if (before_zero_grad) round_trip();
      reducer.zero_grad();
      if (!before_zero_grad) round_trip();
      mlp_loss(params, group.rank()).backward();
      reducer.synchronize();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(at::allclose(params[i].grad(), expected[i], 1e-5, 1e-6))
            << "parameter " << i << (before_zero_grad ? " (before zero_grad)" : " (after zero_grad)");
      }
    }
  });
}

// An Embedding with sparse=true gives sparse gradients, which the buckets take dense:
// accumulated into a view, or copied when the gradient is the caller's or another rank's;
// with the buckets a copy, the mean replaces the sparse gradient.
TEST(GradientReducer, SparseGradientsAreReducedToo) {
  const auto loss = [](const at::Tensor& table, int64_t rank) {
    const at::Tensor ids = at::tensor(std::vector<int64_t>{1 + rank, 3, 3}, at::kLong);
    return at::embedding(table, ids, -1, false, /*sparse=*/true).pow(2).sum();
  };
  const auto table = [] { return (at::arange(24, at::kFloat).reshape({6, 4}) * 0.1).requires_grad_(); };
  at::Tensor expected = table();
  for (int64_t rank = 0; rank < 2; ++rank) loss(expected, rank).backward();
  expected = expected.grad().to_dense() / 2.0;
  stowage::testing::run_ranks(2, [&](const ProcessGroup& group) {
    for (const auto& [owners, views] : {std::pair{false, true}, {true, true}, {false, false}, {true, false}}) {
      std::vector<at::Tensor> params = {table(), table()};
      auto options = GradientReducerOptions().bucket_cap_mb(1e-5).gradient_as_bucket_view(views);
      if (owners) options.gradient_owners({0, 1});
      GradientReducer reducer(params, group, options);
      for (at::Tensor& p : params) p.mutable_grad().reset();  // as Module::zero_grad() on LibTorch 2.x
      (loss(params[0], group.rank()) + loss(params[1], group.rank())).backward();
      reducer.synchronize();
      for (int64_t i = 0; i < 2; ++i) {
        if (owners && i != group.rank()) continue;
        EXPECT_TRUE(at::allclose(params[i].grad(), expected))
            << "parameter " << i << (owners ? " with owners" : "") << (views ? "" : ", buckets a copy");
      }
    }
  });
}

// A Linear and a BatchNorm1d, the same parameters on every rank, and the buffers: the
// norm's (Float running statistics, a 0-dim Long count) and two of other dtypes and sizes
// (neither a multiple of 16 bytes), on `extra_device`.
struct NormModel {
  torch::nn::Linear linear{4, 3};
  torch::nn::BatchNorm1d norm{3};
  std::vector<at::Tensor> extra;

  explicit NormModel(int64_t rank, c10::Device extra_device = c10::kCPU) {
    const at::NoGradGuard no_grad;
    linear->weight.copy_((at::arange(12, at::kFloat).reshape({3, 4}) * 0.3).sin());
    linear->bias.copy_(at::arange(3, at::kFloat) * 0.1);
    // Each rank's own buffers from the start (a model initialised from each rank's seed).
    norm->running_mean.fill_(static_cast<double>(rank));
    extra.push_back(
        at::full({5}, static_cast<double>(rank) + 0.5, at::TensorOptions(at::kDouble).device(extra_device)));
    extra.push_back(at::full({3}, rank == 0, at::TensorOptions(at::kBool).device(extra_device)));
  }
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> params = linear->parameters();
    for (const at::Tensor& p : norm->parameters()) params.push_back(p);
    return params;
  }
  std::vector<at::Tensor> buffers() const {
    std::vector<at::Tensor> buffers = norm->buffers();
    buffers.insert(buffers.end(), extra.begin(), extra.end());
    return buffers;
  }
  // A training forward on rank `rank`'s batch of step `step` (which updates the norm's
  // statistics from that batch) and backward; the extra buffers change as the rank's own.
  void step(int64_t rank, int64_t step) {
    const at::Tensor x =
        (at::arange(8 * 4, at::kFloat).reshape({8, 4}) * 0.1 + static_cast<double>(rank + 3 * step)).cos();
    norm->forward(linear->forward(x)).pow(2).sum().backward();
    const at::NoGradGuard no_grad;
    extra[0].add_(static_cast<double>(rank + 1));
  }
};

std::vector<at::Tensor> cpu_clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> clones;
  clones.reserve(tensors.size());
  for (const at::Tensor& t : tensors) clones.push_back(t.cpu().clone());
  return clones;
}

// DDP's broadcast_buffers: the reducer makes every rank's buffers rank 0's, when made and
// at each synchronize(); with the option off each rank keeps its own.
TEST(GradientReducer, BuffersBecomeRankZerosWhenMadeAndAtEachSynchronizeUnlessTurnedOff) {
  for (const bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "broadcast_buffers(false)");
    constexpr int64_t kSteps = 2;
    // By rank, by moment (0: made, 1 + k: after step k's synchronize()): the buffers.
    std::vector<std::vector<std::vector<at::Tensor>>> seen(2);
    stowage::testing::run_ranks(2, [&](const ProcessGroup& group) {
      NormModel model(group.rank());
      GradientReducer reducer(model.parameters(), model.buffers(), group,
                              GradientReducerOptions().broadcast_buffers(broadcast));
      std::vector<std::vector<at::Tensor>>& mine = seen[static_cast<size_t>(group.rank())];
      mine.push_back(cpu_clones(model.buffers()));
      for (int64_t step = 0; step < kSteps; ++step) {
        reducer.zero_grad();
        model.step(group.rank(), step);
        reducer.synchronize();
        mine.push_back(cpu_clones(model.buffers()));
      }
    });
    // What rank 0 alone holds: its own buffers, its own batches' statistics.
    NormModel alone(0);
    std::vector<std::vector<at::Tensor>> rank0 = {cpu_clones(alone.buffers())};
    for (int64_t step = 0; step < kSteps; ++step) {
      alone.step(0, step);
      rank0.push_back(cpu_clones(alone.buffers()));
    }
    // Buffers 0 (the running mean), 3 and 4 (the extra ones) are each rank's own from the
    // start; the running variance (1) from the first step; the count (2) is every rank's.
    for (size_t moment = 0; moment <= kSteps; ++moment) {
      for (size_t i = 0; i < rank0[moment].size(); ++i) {
        EXPECT_TRUE(seen[0][moment][i].equal(rank0[moment][i])) << "rank 0, buffer " << i << ", moment " << moment;
        const bool ranks_own = i == 0 || i >= 3 || (i == 1 && moment > 0);
        EXPECT_EQ(seen[1][moment][i].equal(seen[0][moment][i]), broadcast || !ranks_own)
            << "rank 1's buffer " << i << " at moment " << moment << ": " << seen[1][moment][i] << " rank 0's "
            << seen[0][moment][i];
      }
    }
  }
}

// Buffers on the test device (the simulated one, in a build against LibTorch 2.x) and on
// the CPU: one broadcast for each device. Two ranks on one GPU cannot share NCCL.
TEST(GradientReducer, BuffersOnTwoDevicesAreBroadcastOnEach) {
  const c10::Device device = stowage::testing::test_device();
  if (device.is_cuda()) GTEST_SKIP() << "two ranks in one process cannot share one GPU's NCCL";
  std::vector<std::vector<at::Tensor>> seen(2);
  stowage::testing::run_ranks(2, [&](const ProcessGroup& group) {
    NormModel model(group.rank(), device);
    GradientReducer reducer(model.parameters(), model.buffers(), group,
                            GradientReducerOptions().broadcast_buffers(false));
    reducer.zero_grad();
    model.step(group.rank(), 0);
    reducer.synchronize();
    reducer.broadcast_buffers();  // by hand, with the option off
    for (const at::Tensor& buffer : model.extra) EXPECT_EQ(buffer.device(), device);
    seen[static_cast<size_t>(group.rank())] = cpu_clones(model.buffers());
  });
  for (size_t i = 0; i < seen[0].size(); ++i) EXPECT_TRUE(seen[1][i].equal(seen[0][i])) << "buffer " << i;
  EXPECT_TRUE(seen[1][3].equal(at::full({5}, 1.5, at::kDouble))) << seen[1][3];
}

TEST(GradientReducer, BroadcastingBuffersMidStepOrChangedOnesIsRefusedByName) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    NormModel model(0);
    GradientReducer reducer(model.parameters(), model.buffers(), group);
    model.step(0, 0);
    try {
      reducer.broadcast_buffers();
      ADD_FAILURE() << "broadcast the buffers while the buckets' collectives may run";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("broadcast_buffers() between a backward and its synchronize()"));
    }
    reducer.synchronize();
    reducer.broadcast_buffers();
    model.norm->running_var.set_data(at::ones({4}));
    try {
      reducer.broadcast_buffers();
      ADD_FAILURE() << "accepted a buffer of another shape";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("buffer 1 changed from [3] Float on cpu to [4] Float on cpu"));
    }
    EXPECT_THROW(reducer.synchronize(), InvalidArgument);
    EXPECT_THROW(GradientReducer(model.parameters(), {at::ones({2}), at::Tensor()}, group), InvalidArgument);
  });
}

TEST(GradientReducer, BadParametersAndOptionsAreRefusedByName) {
  stowage::testing::run_ranks(1, [](const ProcessGroup& group) {
    const at::Tensor leaf = at::ones({4}).requires_grad_();
    try {
      const GradientReducer reducer(std::vector<at::Tensor>{leaf, leaf * 2}, group);
      ADD_FAILURE() << "accepted a non-leaf";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("parameter 1 is not a leaf tensor that requires grad"));
    }
    EXPECT_THROW(GradientReducer(std::vector<at::Tensor>{at::ones({4})}, group), InvalidArgument);
    EXPECT_THROW(GradientReducer(std::vector<at::Tensor>{leaf, at::ones({4}, at::kDouble).requires_grad_()}, group),
                 InvalidArgument);
    EXPECT_THROW(GradientReducer(std::vector<at::Tensor>{leaf}, group, GradientReducerOptions().bucket_cap_mb(0)),
                 InvalidArgument);
    EXPECT_THROW(GradientReducer(std::vector<at::Tensor>{}, group), InvalidArgument);
    try {
      const GradientReducer reducer(std::vector<at::Tensor>{leaf}, group,
                                    GradientReducerOptions().gradient_owners({1}));
      ADD_FAILURE() << "accepted an owner that is no rank";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("gives parameter 0 to rank 1, not a rank of this group of 1"));
    }
    EXPECT_THROW(
        GradientReducer(std::vector<at::Tensor>{leaf}, group, GradientReducerOptions().gradient_owners({0, 0})),
        InvalidArgument);
  });
}

}  // namespace
}  // namespace stowage::dist
