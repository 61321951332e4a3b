#pragma once

// How stowage reads and writes the state of one optimizer type, and the one registry of
// them. OptimizerState (PyTorch's optimizer state-dict layout) and optim::SwapOptimizer
// (which moves the state tensors between the device and the host) both find an
// optimizer's adapter here. This module registers torch::optim::Adam, AdamW and SGD;
// stowage::optim registers its MasterAdamW; a user can register an optimizer of their own
// the same way.

#include <stowage/state/state_dict.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerOptions;
class OptimizerParamState;
}  // namespace torch::optim

namespace stowage {

// References into one parameter's state object.
struct ParamStateFields {
  int64_t* step = nullptr;           // null where the optimizer counts no steps
  std::vector<at::Tensor*> tensors;  // one per OptimizerAdapter::tensor_keys(), in order
};

// Applies a param group's options that OptimizerAdapter::read_options has checked.
using ApplyOptions = std::function<void(torch::optim::OptimizerOptions&)>;

class OptimizerAdapter {
 public:
  virtual ~OptimizerAdapter() = default;
  // The optimizer type, for messages: "torch::optim::Adam".
  virtual std::string name() const = 0;
  // Whether `optimizer` is of this adapter's type (or derives from it).
  virtual bool handles(const torch::optim::Optimizer& optimizer) const = 0;
  // The names of the per-parameter state tensors, as PyTorch names them ("exp_avg", ...).
  virtual const std::vector<std::string>& tensor_keys() const = 0;
  // The dtype of the state tensors of `param`: the parameter's unless the optimizer keeps
  // its state in another precision.
  virtual c10::ScalarType state_dtype(const at::Tensor& param) const { return param.scalar_type(); }
  // Writes a param group's options into `group`, as PyTorch names them.
  virtual void write_options(const torch::optim::OptimizerOptions& options, c10::impl::GenericDict& group) const = 0;
  // Checks the options in `group` (throws stowage::InvalidArgument with a message that
  // starts with `where`) and returns what applies them to a param group of this type.
  virtual ApplyOptions read_options(const c10::impl::GenericDict& group, const std::string& where) const = 0;
  // A new state object of this type: zero steps, every tensor undefined.
  virtual std::unique_ptr<torch::optim::OptimizerParamState> new_state() const = 0;
  // Whether the optimizer counts steps: fields(...).step is non-null.
  virtual bool has_step() const = 0;
  // References into `state`, an object of the type new_state() makes.
  virtual ParamStateFields fields(torch::optim::OptimizerParamState& state) const = 0;
};

// Adds `adapter` to the registry. An optimizer is served by the adapter registered last
// among those that handle it, so an adapter for a subclass overrides its base's. Safe to
// call from any thread, and from a static initializer.
void register_optimizer_adapter(std::shared_ptr<const OptimizerAdapter> adapter);

// The adapter that serves `optimizer`, or null.
const OptimizerAdapter* find_optimizer_adapter(const torch::optim::Optimizer& optimizer);
// The adapter through which `user` ("OptimizerState", which starts the messages) reads and
// writes the state of `optimizer`. Throws stowage::InvalidArgument naming its type and the
// registered ones when none serves it, and naming the wrapper to use instead when one
// claims it (below).
const OptimizerAdapter& optimizer_adapter(const torch::optim::Optimizer& optimizer, const std::string& user);

// A wrapper that keeps an optimizer's state itself (optim::SwapOptimizer: in host buffers or
// files, which only the wrapper knows when to read) claims the optimizer while it lives, so
// that the state is saved and restored through the wrapper only: read through the optimizer,
// it could be caught mid-copy; restored into it, it would land on the device, under the
// wrapper. optimizer_adapter() refuses a claimed optimizer.
//
// Claims `optimizer` for `wrapper` (its name, for messages: "SwapOptimizer"); returns false,
// changing nothing, when it is claimed already. Safe to call from any thread.
bool claim_optimizer(const torch::optim::Optimizer& optimizer, const std::string& wrapper);
// Ends the claim on `optimizer`.
// REQUIRES: claim_optimizer(optimizer, ...) returned true and the claim has not ended.
void release_optimizer_claim(const torch::optim::Optimizer& optimizer);
// The name of the wrapper that claims `optimizer`, or "" when none does.
std::string optimizer_claimant(const torch::optim::Optimizer& optimizer);

// The adapters this module registers.
// The states of `optimizer` in PyTorch's layout (state/stateful.h's OptimizerState), each
// parameter's fields as `adapter` reads them; tensors alias the states. Checks no claim:
// a wrapper writes its wrapped optimizer's states with it.
StateDict write_adapter_state(const OptimizerAdapter& adapter, torch::optim::Optimizer& optimizer);

const OptimizerAdapter& adam_adapter();
const OptimizerAdapter& adamw_adapter();
const OptimizerAdapter& sgd_adapter();

}  // namespace stowage
