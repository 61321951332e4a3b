#pragma once

// Checkpointing applied by policy, the counterpart of PyTorch's
// apply_activation_checkpointing(model, checkpoint_wrapper_fn, check_fn): the sub-modules
// of a module tree that a selector picks run their forward under checkpoint(), without the
// model's code changing.
//
// PyTorch swaps a child through Python's attributes. A C++ module calls its children
// through typed members that nothing outside it can redirect, so two kinds of module can
// be wrapped:
//  - a child of a torch::nn::Sequential, which calls its children through type erasure:
//    the Sequential's entry is replaced in place by a CheckpointWrapper (below) that
//    checkpoints the child's forward (one tensor to one tensor). The child stays
//    registered under its name, so parameters, buffers, state dicts, to() and
//    train()/eval() are as before; the entry (sequential[i], ptr(i)) is the wrapper, as
//    PyTorch's is, and its wrapped() the child. Such a Sequential can no longer be
//    clone()d (it says so) rather than clone a wrapper of the original module;
//  - a CheckpointSite (below), a named place in a module's own forward that runs a
//    computation through the site: selective recompute of the part of a module that holds
//    the most activation memory (Megatron's attention core), not the whole module.
// Any other selected module is an InvalidArgument naming it, before anything changes:
// e.g. a Linear its parent calls as a member, or a child of a ModuleList, which the
// caller's code calls through its own type.
//
//   activation::apply_activation_checkpointing(*model, activation::module_type<BlockImpl>());
//   activation::apply_activation_checkpointing(*model, activation::module_name(R"(.*\.attention_core)"));

#include <stowage/activation/checkpoint.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace stowage::activation {

// A place in a module's forward whose computation may run under checkpoint(), once a
// policy enables it. It holds no parameters or buffers: registering one changes no name
// in the module's state dict.
//
//   attention_core_ = register_module("attention_core", activation::CheckpointSite());
//   ... auto out = attention_core_->forward(core_fn, {q, k, v});
//
// fn must take every tensor it needs as an input: a captured tensor that is not a leaf
// would be back-propagated into from inside the recomputation.
class CheckpointSiteImpl : public torch::nn::Cloneable<CheckpointSiteImpl> {
 public:
  void reset() override {}

  // fn(inputs), under checkpoint() when the site is enabled, else plainly.
  std::vector<c10::IValue> forward(const CheckpointFunction& fn, const std::vector<c10::IValue>& inputs);
  at::Tensor forward(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);

  void enable(CheckpointOptions options) { options_ = std::move(options); }
  void disable() { options_.reset(); }
  bool enabled() const { return options_.has_value(); }

 private:
  std::optional<CheckpointOptions> options_;
};
TORCH_MODULE(CheckpointSite);

// What a Sequential's entry becomes once wrapped: the child's forward under checkpoint().
// It is not registered (the child stays registered), and not cloneable, so that cloning
// the Sequential fails rather than give a clone that runs the original child.
class CheckpointWrapperImpl : public torch::nn::Module {
 public:
  CheckpointWrapperImpl(torch::nn::AnyModule wrapped, CheckpointOptions options);
  at::Tensor forward(const at::Tensor& input);
  std::shared_ptr<torch::nn::Module> wrapped() const { return wrapped_.ptr(); }
  const torch::nn::AnyModule& wrapped_entry() const { return wrapped_; }
  const CheckpointOptions& options() const { return options_; }

 private:
  torch::nn::AnyModule wrapped_;
  CheckpointOptions options_;
};

// Picks sub-modules by their qualified name ("blocks.0.mlp") and the module itself.
using ModuleSelector = std::function<bool(const std::string& name, const torch::nn::Module& module)>;

// The modules of type ModuleImpl (e.g. a model's BlockImpl), by dynamic_cast.
template <typename ModuleImpl>
ModuleSelector module_type() {
  return [](const std::string& /*name*/, const torch::nn::Module& module) {
    return dynamic_cast<const ModuleImpl*>(&module) != nullptr;
  };
}

// The modules whose whole qualified name matches the ECMAScript regular expression
// `pattern`; InvalidArgument naming it if it does not compile.
ModuleSelector module_name(const std::string& pattern);

// Wraps every sub-module of `root` (not root itself) that `select` picks, as above, with
// `options` plus the module's buffers (CheckpointOptions::buffers). Returns the qualified
// names wrapped, in the order of root.named_modules(). A selector that picks nothing
// warns and changes nothing; a module already wrapped is left as it is.
// Throws InvalidArgument naming the first selected module that cannot be wrapped; then
// nothing has changed.
std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& root, const ModuleSelector& select,
                                                        const CheckpointOptions& options = {});

// Undoes apply_activation_checkpointing over the whole tree of `root` (root included):
// every CheckpointWrapper entry of a Sequential is replaced by the module it wraps, and
// every CheckpointSite disabled. Returns how many were undone.
int clear_activation_checkpointing(torch::nn::Module& root);

}  // namespace stowage::activation
