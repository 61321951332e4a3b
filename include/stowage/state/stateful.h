#pragma once

// Objects that can save and restore themselves through a StateDict, like Python's
// torch.distributed.checkpoint.stateful.Stateful, and adapters for LibTorch's modules
// and optimizers.
//
// A Stateful can stand as a top-level value of a state dict passed to stowage::dcp's
// save/load: wrap it with as_ivalue(). The checkpoint functions call state_dict() on the
// caller's thread before staging; load calls check_load_state_dict() while it plans,
// before anything changes, and load_state_dict() after loading.

#include <stowage/state/state_dict.h>

#include <ATen/core/ivalue.h>
#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}
}  // namespace torch

namespace stowage {

class OptimizerAdapter;

// Derives from CustomClassHolder so that an IValue capsule can carry it.
class Stateful : public torch::CustomClassHolder {
 public:
  ~Stateful() override = default;
  // The object's state. Tensors may alias the live object (no copy is promised).
  virtual StateDict state_dict() = 0;
  // Restores from a state dict shaped like state_dict()'s. Validates everything before
  // changing anything: on an exception the object is unchanged.
  virtual void load_state_dict(const StateDict& state) = 0;
  // Throws what load_state_dict(state) would throw for the structure of `state`, and
  // changes nothing. dcp::load calls it in its planning pass, before the first byte of
  // any entry is written, with the state dict it will later hand to load_state_dict:
  // its keys, non-tensor values and tensors' shapes and dtypes are final, but the
  // tensors' contents are not loaded yet. So a load whose Stateful passes this check
  // can still fail after the other entries were filled only in what this cannot see:
  // a check of tensor contents, or a lack of resources (memory, a device copy) in
  // load_state_dict. The default checks nothing: a Stateful that does not override it
  // has its load_state_dict as its only check, after the rest of the load.
  virtual void check_load_state_dict(const StateDict& state);
  // Whether load_state_dict needs the saved entry at `path` (below the object's own key)
  // that state_dict() does not have. dcp::load reads only the ones it needs. The default
  // is every one; a sharded object (optim::ZeroRedundancyOptimizer) skips the parts that
  // other ranks own.
  virtual bool needs_saved_entry(const ObjectPath& path) const;
  // The entries of state_dict() (paths below the object's own key) that may change
  // outside the optimizer step, e.g. in the next forward, as a module's buffers do.
  // dcp::async_save copies them before it returns; every other entry is staged in the
  // background and must not change until staging completes. The default is none: a
  // Stateful whose forward writes its state must list that state here.
  virtual std::vector<ObjectPath> entries_written_in_forward();
};

// Wraps a Stateful as a value that can be inserted into a StateDict.
c10::IValue as_ivalue(c10::intrusive_ptr<Stateful> object);
// The Stateful inside `value`, or nullptr if `value` holds none.
c10::intrusive_ptr<Stateful> as_stateful(const c10::IValue& value);

// A module's parameters and buffers by dotted name ("layers.0.weight"), like PyTorch's
// Module.state_dict(). Tensors alias the module's (detached). load_state_dict is strict:
// missing or unexpected keys, shape or dtype mismatches are errors.
class ModuleState final : public Stateful {
 public:
  explicit ModuleState(std::shared_ptr<torch::nn::Module> module);
  StateDict state_dict() override;
  // Every buffer (BatchNorm's running statistics and counter change in each forward).
  std::vector<ObjectPath> entries_written_in_forward() override;
  void load_state_dict(const StateDict& state) override;
  // Every check of load_state_dict: keys, shapes, dtypes, and that each parameter and
  // buffer can be written in place.
  void check_load_state_dict(const StateDict& state) override;

 private:
  std::shared_ptr<torch::nn::Module> module_;
};

// An optimizer's state in PyTorch's layout, with string keys:
//   {"state": {"<i>": {"step": int, "exp_avg": T, ...}},
//    "param_groups": [{"lr": ..., <every option>, "params": [i, ...]}]}
// where i numbers the parameters across groups in order. Supports every optimizer type
// with a registered OptimizerAdapter (state/optimizer_adapter.h: torch::optim::Adam,
// AdamW, SGD, stowage::optim::MasterAdamW, and the user's own); others are rejected by
// name. Tensors alias the optimizer's state. load_state_dict copies tensors onto each
// parameter's device, in the dtype the adapter keeps the state in (the parameter's, or
// fp32 for MasterAdamW). Like PyTorch's, it also sets every group's options (lr, betas,
// amsgrad, ...) to the saved ones, replacing those the optimizer was made with: change
// an option after loading, not before. An optimizer that a live SwapOptimizer wraps is
// refused (InvalidArgument naming the fix, before anything changes) when made and at each
// call: the SwapOptimizer keeps its state, and is what to save and restore.
class OptimizerState final : public Stateful {
 public:
  explicit OptimizerState(std::shared_ptr<torch::optim::Optimizer> optimizer);
  StateDict state_dict() override;
  void load_state_dict(const StateDict& state) override;
  // Every check of load_state_dict: the param groups' count and sizes, their options,
  // every state entry's keys, types and shapes.
  void check_load_state_dict(const StateDict& state) override;

 private:
  // Throws InvalidArgument if a SwapOptimizer wrapped the optimizer since construction.
  void check_not_claimed() const;

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  const OptimizerAdapter* adapter_;  // the optimizer's, from the registry
};

c10::IValue as_ivalue(std::shared_ptr<torch::nn::Module> module);
c10::IValue as_ivalue(std::shared_ptr<torch::optim::Optimizer> optimizer);

}  // namespace stowage
