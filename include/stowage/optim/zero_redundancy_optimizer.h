#pragma once

// ZeRO stage 1, as PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer: in data
// parallelism every rank holds the whole model and the same averaged gradients, but
// each rank owns a contiguous share of the parameters (balanced by bytes), keeps the
// optimizer state of that share only, updates it, and broadcasts the updated share to
// the other ranks. Optimizer-state memory per rank falls by the number of ranks.
//
//   auto zero = c10::make_intrusive<ZeroRedundancyOptimizer>(
//       model->parameters(),
//       [](std::vector<at::Tensor> share) { return std::make_shared<torch::optim::AdamW>(share); },
//       group);
//   ... loss.backward(); (average the gradients over the ranks) zero->step();
//
// ZeRO stage 2 shards the gradients the same way: a dist::GradientReducer given
// owners() reduces each gradient to its owner alone, so that a rank keeps only the
// gradients of its own share (and zeroes them with the reducer's zero_grad()):
//
//   dist::GradientReducer reducer(params, group,
//                                 dist::GradientReducerOptions().gradient_owners(zero->owners()));
//   reducer.zero_grad(); loss.backward(); reducer.synchronize(); zero->step();
//
// The owned share's states can be swapped to host memory between steps as well
// (ZeroRedundancyOptimizerOptions::swap: a SwapOptimizer over the share's optimizer).
//
// As a Stateful it speaks the layout of one optimizer over every parameter
// (stowage::OptimizerState's, numbered globally, one param group): each rank's
// state_dict() holds the states of its own share and the param group over all
// parameters, so a dcp::save with the group writes one optimizer's state, which any
// number of ranks loads back, each rank reading only its own share's states
// (needs_saved_entry). It also loads a plain optimizer's state of the same parameters.
//
// Failures: step() fails as the share's optimizer does (SwapOptimizer's guarantees
// with swap), and then does not broadcast, so the ranks must not go on with that group;
// a failed broadcast is a dist::CollectiveError. The constructor and load_state_dict
// throw InvalidArgument, naming the culprit, and change nothing.

#include <stowage/dist/process_group.h>
#include <stowage/optim/swap_config.h>
#include <stowage/optim/swap_optimizer.h>
#include <stowage/state/stateful.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace stowage::optim {

// Parameters [begin, end) in the optimizer's order.
struct ParamRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t index) const { return index >= begin && index < end; }
};

// One contiguous range per rank, balanced by bytes (partition_by_cost). Throws
// InvalidArgument when there are fewer parameters than ranks.
std::vector<ParamRange> shard_parameters(const std::vector<at::Tensor>& params, int64_t ranks);

struct ZeroRedundancyOptimizerOptions {
  // Swap the owned share's optimizer states to host memory between steps with this
  // config; none: they stay where the share's optimizer keeps them.
  TORCH_ARG(std::optional<SwapOptimizerConfig>, swap) = std::nullopt;
};

class ZeroRedundancyOptimizer final : public Stateful {
 public:
  // Makes the optimizer of this rank's share (one param group over `share`): an Adam,
  // AdamW or SGD for the Stateful layout; an Adam or AdamW with swap.
  using OptimizerFactory = std::function<std::shared_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> share)>;

  // `params` in the same order on every rank, all on one device with one dtype. Without
  // a group, this process is the only rank and owns every parameter. Not collective
  // (step() is).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const OptimizerFactory& make_optimizer,
                          std::optional<dist::ProcessGroup> group, ZeroRedundancyOptimizerOptions options = {});

  // Updates the owned share from its gradients, then broadcasts every rank's share
  // (collective). Only the owned share's gradients are read: they must be the ranks'
  // average (a GradientReducer's, with or without owners) for the replicas to stay equal.
  void step();
  // Resets the gradients of every parameter (not only the owned ones), as PyTorch's.
  // With a dist::GradientReducer, use its zero_grad(), which keeps its gradients' storage.
  void zero_grad();

  // The share of each rank, by rank.
  const std::vector<ParamRange>& shares() const { return shares_; }
  ParamRange owned() const { return shares_[static_cast<size_t>(rank_)]; }
  // The rank that owns each parameter, by parameter.
  std::vector<int64_t> owners() const;
  // The owned share's optimizer (its param group's options, e.g. to change lr).
  torch::optim::Optimizer& local_optimizer() { return *local_; }
  // The swap over the owned share, or nullptr without ZeroRedundancyOptimizerOptions::swap.
  const c10::intrusive_ptr<SwapOptimizer>& swap() const { return swap_; }
  // The bytes of the owned share's optimizer state on the device between steps: the
  // swap's resident_state_bytes(), or every state tensor of the local optimizer. Counted
  // from the tensors, so other threads' memory (a background checkpoint save's) is not in it.
  int64_t resident_state_bytes() const;

  StateDict state_dict() override;
  // Takes the layout above from any number of ranks, or a plain optimizer's state over
  // the same parameters (all of it, or only this rank's share of "state").
  void load_state_dict(const StateDict& state) override;
  void check_load_state_dict(const StateDict& state) override;
  // Everything but the states of parameters other ranks own.
  bool needs_saved_entry(const ObjectPath& path) const override;

 private:
  // The owned share's part of `state`, in the local optimizer's numbering; throws
  // InvalidArgument naming the culprit.
  StateDict local_part(const StateDict& state) const;
  // Sends each rank's share to the others.
  void broadcast_shares();

  std::vector<at::Tensor> params_;
  std::optional<dist::ProcessGroup> group_;
  int64_t rank_ = 0;
  std::vector<ParamRange> shares_;
  std::shared_ptr<torch::optim::Optimizer> local_;
  c10::intrusive_ptr<SwapOptimizer> swap_;
  c10::intrusive_ptr<Stateful> local_state_;  // swap_, or an OptimizerState over local_
};

}  // namespace stowage::optim
