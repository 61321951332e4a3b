// GradientReducer on groups of 1 to 3 ranks run as threads: the gradients after
// synchronize() are the mean of every rank's, with the overlap and without, in buckets
// of the cap; misuse and bad parameters are refused by name.

#include "process_groups.h"

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

INSTANTIATE_TEST_SUITE_P(RanksAndOverlap, GradientReducerRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

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
  });
}

}  // namespace
}  // namespace stowage::dist
