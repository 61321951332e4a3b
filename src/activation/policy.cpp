#include <stowage/activation/policy.h>

#include "activation/module_buffers.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <regex>
#include <utility>

namespace stowage::activation {
namespace {

// A selected module and what wrapping it changes.
struct Target {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  CheckpointSiteImpl* site = nullptr;               // a site to enable, or
  torch::nn::SequentialImpl* sequential = nullptr;  // the Sequential whose entry `entry` is the module
  size_t entry = 0;
};

[[noreturn]] void refuse(const std::string& name, const torch::nn::Module& module, const torch::nn::Module& parent) {
  const bool in_module_list = dynamic_cast<const torch::nn::ModuleListImpl*>(&parent) != nullptr;
  throw InvalidArgument(fmt::format(
      "apply_activation_checkpointing: cannot wrap '{}' ({}): {}; only the children of a Sequential and "
      "CheckpointSites can be wrapped (run the computation through a CheckpointSite of the parent's forward, or "
      "put the module in a Sequential); nothing was changed",
      name, module.name(),
      in_module_list ? "it is a child of a ModuleList, which the code that uses it calls through its own type"
                     : fmt::format("its parent ({}) calls it through a member, which C++ gives no way to redirect",
                                   parent.name())));
}

// The entry of `sequential` that runs `module` (wrapped or not).
size_t entry_of(torch::nn::SequentialImpl& sequential, const torch::nn::Module* module, bool* wrapped) {
  size_t index = 0;
  for (const torch::nn::AnyModule& entry : sequential) {
    const auto* wrapper = dynamic_cast<const CheckpointWrapperImpl*>(entry.ptr().get());
    *wrapped = wrapper != nullptr && wrapper->wrapped().get() == module;
    if (entry.ptr().get() == module || *wrapped) return index;
    ++index;
  }
  // A child a Sequential registered but does not run: only register_module() makes one.
  throw InvalidArgument(
      fmt::format("apply_activation_checkpointing: a {} is registered in a Sequential but is not one of its entries",
                  module->name()));
}

}  // namespace

CheckpointWrapperImpl::CheckpointWrapperImpl(torch::nn::AnyModule wrapped, CheckpointOptions options)
    : wrapped_(std::move(wrapped)), options_(std::move(options)) {}

at::Tensor CheckpointWrapperImpl::forward(const at::Tensor& input) {
  return checkpoint([wrapped = wrapped_](const at::Tensor& x) mutable { return wrapped.forward(x); }, input, options_);
}

std::vector<c10::IValue> CheckpointSiteImpl::forward(const CheckpointFunction& fn,
                                                     const std::vector<c10::IValue>& inputs) {
  if (!fn) throw InvalidArgument("CheckpointSite: fn is empty");
  return options_ ? checkpoint(fn, inputs, *options_) : fn(inputs);
}

at::Tensor CheckpointSiteImpl::forward(const std::function<at::Tensor(const at::Tensor&)>& fn,
                                       const at::Tensor& input) {
  if (!fn) throw InvalidArgument("CheckpointSite: fn is empty");
  return options_ ? checkpoint(fn, input, *options_) : fn(input);
}

ModuleSelector module_name(const std::string& pattern) {
  std::regex regex;
  try {
    regex = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InvalidArgument(fmt::format("module_name: '{}' is not a regular expression: {}", pattern, e.what()));
  }
  return
      [regex](const std::string& name, const torch::nn::Module& /*module*/) { return std::regex_match(name, regex); };
}

std::vector<std::string> apply_activation_checkpointing(torch::nn::Module& root, const ModuleSelector& select,
                                                        const CheckpointOptions& options) {
  if (!select) throw InvalidArgument("apply_activation_checkpointing: the selector is empty");
  const auto modules = root.named_modules(/*name_prefix=*/"", /*include_self=*/false);

  // Every target is found before any is wrapped, so that a refusal changes nothing.
  bool selected_any = false;
  std::vector<Target> targets;
  for (const auto& item : modules) {
    Target target{item.key(), item.value()};
    if (!select(target.name, *target.module)) continue;
    selected_any = true;
    if ((target.site = dynamic_cast<CheckpointSiteImpl*>(target.module.get())) != nullptr) {
      if (!target.site->enabled()) targets.push_back(std::move(target));
      continue;
    }
    const size_t dot = target.name.rfind('.');
    torch::nn::Module& parent = dot == std::string::npos ? root : *modules[target.name.substr(0, dot)];
    target.sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent);
    if (target.sequential == nullptr) refuse(target.name, *target.module, parent);
    bool wrapped = false;
    target.entry = entry_of(*target.sequential, target.module.get(), &wrapped);
    if (!wrapped) targets.push_back(std::move(target));
  }
  if (!selected_any) {
    TORCH_WARN("apply_activation_checkpointing: the selector picks none of the ", modules.size(), " sub-modules of ",
               root.name(), "; nothing is checkpointed");
  }

  std::vector<std::string> names;
  for (Target& target : targets) {
    if (target.site != nullptr) {
      target.site->enable(options);
    } else {
      auto entry = target.sequential->begin() + static_cast<std::ptrdiff_t>(target.entry);
      *entry = torch::nn::AnyModule(
          std::make_shared<CheckpointWrapperImpl>(*entry, with_buffers_of(*target.module, options)));
    }
    names.push_back(std::move(target.name));
  }
  return names;
}

int clear_activation_checkpointing(torch::nn::Module& root) {
  int undone = 0;
  for (const auto& module : root.modules(/*include_self=*/true)) {
    if (auto* site = dynamic_cast<CheckpointSiteImpl*>(module.get()); site != nullptr && site->enabled()) {
      site->disable();
      ++undone;
    } else if (auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(module.get())) {
      for (torch::nn::AnyModule& entry : *sequential) {
        if (const auto* wrapper = dynamic_cast<const CheckpointWrapperImpl*>(entry.ptr().get())) {
          torch::nn::AnyModule unwrapped = wrapper->wrapped_entry();  // before the wrapper goes
          entry = std::move(unwrapped);
          ++undone;
        }
      }
    }
  }
  return undone;
}

}  // namespace stowage::activation
