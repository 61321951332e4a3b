#pragma once

// Data parallelism for `stowage train`, with the optimizer state sharded (ZeRO stage 1):
// every rank holds the whole model and computes gradients on its slice of each global
// batch; the gradients are averaged over the ranks; each rank owns a contiguous range of
// the parameters, keeps the optimizer state of those only, updates them, and sends them
// to the other ranks.
//
// In a checkpoint, the optimizer state keeps the layout of one optimizer over every
// parameter (stowage::OptimizerState's, with the global parameter numbering): each rank
// saves the states of the parameters it owns, so any number of ranks loads it back, each
// reading only its own parameters' states.

#include <stowage/dcp/metadata.h>
#include <stowage/dcp/process_group.h>
#include <stowage/state/stateful.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace stowage::cli {

// Parameters [begin, end) in the model's order.
struct ParamRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// One contiguous range per rank, balanced by bytes. Throws InvalidArgument when there
// are fewer parameters than ranks.
std::vector<ParamRange> shard_parameters(const std::vector<at::Tensor>& params, int64_t ranks);

// The optimizer of one rank's parameters seen as the optimizer of all of them: its
// state_dict() renumbers the states into the global numbering and lists every parameter
// in its single param group; load_state_dict() takes such a state (all of it, or only
// this rank's part) and hands the rank's part to the local optimizer.
class ShardedOptimizerState final : public Stateful {
 public:
  // `local` is the state of an optimizer with one param group over the parameters `owned`
  // of `total_params`.
  ShardedOptimizerState(c10::intrusive_ptr<Stateful> local, ParamRange owned, int64_t total_params);

  StateDict state_dict() override;
  void load_state_dict(const StateDict& state) override;

  // The part of the checkpoint entry `key` (saved from a ShardedOptimizerState with any
  // number of ranks, or from a plain optimizer) that this rank loads: the param groups
  // and its own parameters' states, with tensors allocated as saved, for dcp::load to fill.
  StateDict load_request(const dcp::Metadata& metadata, const std::string& key) const;

 private:
  c10::intrusive_ptr<Stateful> local_;
  ParamRange owned_;
  int64_t total_params_;
};

// The collectives of a data-parallel step over `group`.
class DataParallel {
 public:
  DataParallel(dcp::ProcessGroup group, std::vector<at::Tensor> params, std::vector<ParamRange> ranges);

  // Replaces every gradient by its mean over the ranks (a missing one counts as zeros).
  void average_gradients();
  // Sends each rank's updated parameters to the others.
  void share_parameters();
  // The mean of `value` over the ranks.
  double average(double value);

 private:
  dcp::ProcessGroup group_;
  std::vector<at::Tensor> params_;
  std::vector<ParamRange> ranges_;
};

}  // namespace stowage::cli
