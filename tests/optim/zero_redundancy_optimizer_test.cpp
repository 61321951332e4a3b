// ZeroRedundancyOptimizer on 1, 2 and 4 ranks of a real Gloo group (threads of this
// process): its updates are plain AdamW's bit for bit, with and without swap; its state
// saved by dcp on some number of ranks resumes exactly on another; bad input is refused
// by name and changes nothing.

#include "dcp/test_util.h"
#include "optim/swap_test_util.h"
#include "process_groups.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/optim/zero_redundancy_optimizer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace stowage::optim {
namespace {

using stowage::testing::run_ranks;
using testing::adamw;
using testing::clone_params;
using testing::expect_params_equal;
using testing::expect_state_dicts_equal;
using ::testing::HasSubstr;

const testing::Shapes kZeroShapes = {{16, 8}, {8}, {32, 4}, {4}, {7}, {3, 3}, {40}};

ZeroRedundancyOptimizer::OptimizerFactory decaying_adamw_factory() {
  return [](const std::vector<at::Tensor>& share) {
    return adamw(share, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  };
}

// Gradients that depend only on the parameters' values and the step, so every rank
// computes the same ones (as averaged gradients are) without a shared random generator.
void set_replicated_grads(std::vector<at::Tensor>& params, int step) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = (params[i].detach() * 0.7 + 0.13 * step + static_cast<double>(i)).cos();
  }
}

// Plain AdamW over every parameter for `steps` steps, from `initial`.
std::vector<at::Tensor> plain_run(const std::vector<at::Tensor>& initial, int steps, StateDict* final_state = nullptr) {
  std::vector<at::Tensor> params = clone_params(initial);
  auto optimizer = adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < steps; ++step) {
    set_replicated_grads(params, step);
    optimizer->step();
  }
  if (final_state != nullptr) *final_state = OptimizerState(optimizer).state_dict();
  return params;
}

// `ranks` copies of `initial`, one per rank, made on this thread.
std::vector<std::vector<at::Tensor>> copies(const std::vector<at::Tensor>& initial, int64_t ranks) {
  std::vector<std::vector<at::Tensor>> out;
  for (int64_t r = 0; r < ranks; ++r) out.push_back(clone_params(initial));
  return out;
}

void train(ZeroRedundancyOptimizer& zero, std::vector<at::Tensor>& params, int first_step, int steps) {
  for (int step = first_step; step < first_step + steps; ++step) {
    set_replicated_grads(params, step);
    zero.step();
  }
}

TEST(ZeroRedundancyOptimizer, SharesAreContiguousBalancedByBytesAndOnePerRank) {
  const std::vector<at::Tensor> params = testing::make_params(kZeroShapes);
  const std::vector<ParamRange> shares = shard_parameters(params, 3);
  ASSERT_EQ(shares.size(), 3u);
  EXPECT_EQ(shares.front().begin, 0);
  EXPECT_EQ(shares.back().end, static_cast<int64_t>(params.size()));
  for (size_t r = 1; r < shares.size(); ++r) EXPECT_EQ(shares[r].begin, shares[r - 1].end);
  for (const ParamRange& share : shares) EXPECT_GE(share.size(), 1);
  // {16, 8} alone is 128 of the 323 elements: the first share stops there or one after.
  EXPECT_LE(shares[0].end, 2);
  try {
    shard_parameters(params, 8);
    ADD_FAILURE() << "sharded 7 parameters over 8 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("7 parameter tensors over 8 ranks"));
  }
}

class ZeroSteps : public ::testing::TestWithParam<int64_t> {};

TEST_P(ZeroSteps, StepsAreThoseOfPlainAdamWOnEveryRank) {
  const int64_t ranks = GetParam();
  const std::vector<at::Tensor> initial = testing::make_params(kZeroShapes);
  const std::vector<at::Tensor> expected = plain_run(initial, 4);
  std::vector<std::vector<at::Tensor>> params = copies(initial, ranks);
  run_ranks(ranks, [&](const dist::ProcessGroup& group) {
    std::vector<at::Tensor>& mine = params[static_cast<size_t>(group.rank())];
    ZeroRedundancyOptimizer zero(mine, decaying_adamw_factory(), group);
    EXPECT_EQ(static_cast<int64_t>(zero.shares().size()), ranks);
    train(zero, mine, 0, 4);
    // Each rank keeps the states of its own share only.
    const StateDict state = zero.state_dict();
    std::set<std::string> ids;
    for (const auto& item : state.at("state").toGenericDict()) ids.insert(item.key().toStringRef());
    std::set<std::string> owned;
    for (int64_t i = zero.owned().begin; i < zero.owned().end; ++i) owned.insert(std::to_string(i));
    EXPECT_EQ(ids, owned) << "rank " << group.rank();
    EXPECT_EQ(state.at("param_groups").toList().get(0).toGenericDict().at("params").toIntList().size(),
              kZeroShapes.size());
  });
  for (const std::vector<at::Tensor>& replica : params) expect_params_equal(expected, replica);
}

TEST_P(ZeroSteps, TheOwnedShareSwappedStepsAsPlainAdamW) {
  const int64_t ranks = GetParam();
  const testing::Shapes shapes = {{testing::kSwappedNumel}, {8}, {testing::kSwappedNumel / 2, 4}, {4}, {7}};
  const std::vector<at::Tensor> initial = testing::make_params(shapes);
  const std::vector<at::Tensor> expected = plain_run(initial, 3);
  std::vector<std::vector<at::Tensor>> params = copies(initial, ranks);
  run_ranks(ranks, [&](const dist::ProcessGroup& group) {
    std::vector<at::Tensor>& mine = params[static_cast<size_t>(group.rank())];
    ZeroRedundancyOptimizer zero(mine, decaying_adamw_factory(), group,
                                 ZeroRedundancyOptimizerOptions().swap(SwapOptimizerConfig().swap_times(2)));
    ASSERT_TRUE(zero.swap());
    train(zero, mine, 0, 3);
    bool owns_swapped = false;
    for (int64_t i = zero.owned().begin; i < zero.owned().end; ++i) {
      owns_swapped = owns_swapped || mine[static_cast<size_t>(i)].numel() >= testing::kSwappedNumel;
    }
    if (owns_swapped) EXPECT_GT(zero.swap()->copy_stats().h2d_copies, 0) << "rank " << group.rank();
  });
  for (const std::vector<at::Tensor>& replica : params) expect_params_equal(expected, replica);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroSteps, ::testing::Values(1, 2, 4));

// Saved by `save_ranks` after 3 steps, resumed by `load_ranks` for 2 more: the
// parameters and the states are plain AdamW's after 5.
void expect_resumes_exactly(int64_t save_ranks, int64_t load_ranks) {
  const std::vector<at::Tensor> initial = testing::make_params(kZeroShapes);
  const std::vector<at::Tensor> after_three = plain_run(initial, 3);
  StateDict expected_state;
  const std::vector<at::Tensor> expected = plain_run(initial, 5, &expected_state);
  const dcp::testing::ScratchDir dir;

  std::vector<std::vector<at::Tensor>> saving = copies(initial, save_ranks);
  run_ranks(save_ranks, [&](const dist::ProcessGroup& group) {
    std::vector<at::Tensor>& mine = saving[static_cast<size_t>(group.rank())];
    auto zero = c10::make_intrusive<ZeroRedundancyOptimizer>(mine, decaying_adamw_factory(), group);
    train(*zero, mine, 0, 3);
    StateDict state;
    state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(zero)));
    dcp::save(state, dir.path(), group);
  });

  std::vector<std::vector<at::Tensor>> loading = copies(after_three, load_ranks);
  std::vector<StateDict> states(static_cast<size_t>(load_ranks));
  run_ranks(load_ranks, [&](const dist::ProcessGroup& group) {
    std::vector<at::Tensor>& mine = loading[static_cast<size_t>(group.rank())];
    auto zero = c10::make_intrusive<ZeroRedundancyOptimizer>(mine, decaying_adamw_factory(), group);
    StateDict state;
    state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(zero)));
    dcp::load(state, dir.path(), {}, group);
    train(*zero, mine, 3, 2);
    states[static_cast<size_t>(group.rank())] = zero->state_dict();
  });
  for (const std::vector<at::Tensor>& replica : loading) expect_params_equal(expected, replica);
  // The ranks' states together are the plain optimizer's.
  StateDict merged = states.front();
  auto merged_states = merged.at("state").toGenericDict();
  for (const StateDict& state : states) {
    for (const auto& item : state.at("state").toGenericDict()) merged_states.insert(item.key(), item.value());
  }
  expect_state_dicts_equal(expected_state, merged);
}

TEST(ZeroResume, StateSavedOnFourRanksResumesOnTwoExactly) {
  expect_resumes_exactly(4, 2);
}

TEST(ZeroResume, StateSavedOnTwoRanksResumesOnFourExactly) {
  expect_resumes_exactly(2, 4);
}

TEST(ZeroResume, StateSavedOnTwoRanksResumesOnOneExactly) {
  expect_resumes_exactly(2, 1);
}

TEST(ZeroResume, APlainOptimizersStateLoadsIntoEachShare) {
  const std::vector<at::Tensor> initial = testing::make_params(kZeroShapes);
  StateDict plain_state;
  const std::vector<at::Tensor> after_two = plain_run(initial, 2, &plain_state);
  StateDict expected_state;
  const std::vector<at::Tensor> expected = plain_run(initial, 4, &expected_state);
  std::vector<std::vector<at::Tensor>> params = copies(after_two, 2);
  run_ranks(2, [&](const dist::ProcessGroup& group) {
    std::vector<at::Tensor>& mine = params[static_cast<size_t>(group.rank())];
    ZeroRedundancyOptimizer zero(mine, decaying_adamw_factory(), group);
    zero.load_state_dict(plain_state);
    train(zero, mine, 2, 2);
  });
  for (const std::vector<at::Tensor>& replica : params) expect_params_equal(expected, replica);
}

TEST(ZeroRedundancyOptimizer, BadStateIsRefusedByNameAndChangesNothing) {
  std::vector<at::Tensor> params = testing::make_params(kZeroShapes);
  ZeroRedundancyOptimizer zero(params, decaying_adamw_factory(), std::nullopt);
  train(zero, params, 0, 1);
  const StateDict before = zero.state_dict();
  const auto expect_refused = [&](const StateDict& bad, const std::string& culprit) {
    try {
      zero.load_state_dict(bad);
      ADD_FAILURE() << "loaded a state with " << culprit;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr(culprit));
    }
    EXPECT_THROW(zero.check_load_state_dict(bad), InvalidArgument);
    expect_state_dicts_equal(before, zero.state_dict());
  };

  StateDict unparsable = zero.state_dict();
  unparsable.at("state").toGenericDict().insert("x1", unparsable.at("state").toGenericDict().at("0"));
  expect_refused(unparsable, "state.x1 is not one of the 7 parameter ids");

  StateDict out_of_range = zero.state_dict();
  out_of_range.at("state").toGenericDict().insert("7", out_of_range.at("state").toGenericDict().at("0"));
  expect_refused(out_of_range, "state.7 is not one of the 7 parameter ids");

  StateDict fewer = zero.state_dict();
  fewer.at("param_groups").toList().get(0).toGenericDict().insert_or_assign("params", c10::List<int64_t>({0, 1}));
  expect_refused(fewer, "the saved optimizer has 2 parameters, this one 7");

  StateDict wrong_shape = zero.state_dict();
  wrong_shape.at("state").toGenericDict().at("1").toGenericDict().insert_or_assign("exp_avg", torch::zeros({9}));
  expect_refused(wrong_shape, "state.1");
}

TEST(ZeroRedundancyOptimizer, BadParametersOrFactoriesAreRefusedByName) {
  std::vector<at::Tensor> mixed = testing::make_params({{4}, {5}});
  mixed[1] = mixed[1].detach().to(at::kDouble).requires_grad_();
  try {
    const ZeroRedundancyOptimizer optimizer(mixed, decaying_adamw_factory(), std::nullopt);
    ADD_FAILURE() << "accepted parameters of two dtypes";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("parameter 1 is Double"));
  }
  const std::vector<at::Tensor> params = testing::make_params({{4}, {5}});
  const auto drops_one = [](std::vector<at::Tensor> share) {
    share.pop_back();
    return adamw(share);
  };
  EXPECT_THROW(ZeroRedundancyOptimizer(params, drops_one, std::nullopt), InvalidArgument);
  const auto returns_none = [](const std::vector<at::Tensor>&) { return std::shared_ptr<torch::optim::Optimizer>(); };
  EXPECT_THROW(ZeroRedundancyOptimizer(params, returns_none, std::nullopt), InvalidArgument);
}

}  // namespace
}  // namespace stowage::optim
