#pragma once

// PyTorch's optimizer state-dict layout, with string keys:
//   {"state": {"<i>": {"step": int, "<state>": T, ...}},
//    "param_groups": [{<options>, "params": [i, ...]}, ...]}
// where i numbers the parameters across groups in order. Written and read here for every
// Stateful that speaks it (OptimizerState, optim::SwapOptimizer), so that they accept the
// same input and reject bad input with the same messages.

#include <stowage/state/state_dict.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace torch::optim {
class Optimizer;
class OptimizerOptions;
}  // namespace torch::optim

namespace stowage {

// A state dict of the layout whose outline has been checked against an optimizer.
struct OptimizerLayout {
  struct Group {
    std::string where;  // "<where>: param_groups.<g>", to start messages about it
    c10::impl::GenericDict options;
  };
  struct Entry {
    size_t param;       // index into `params`
    std::string where;  // "<where>: state.<i>"
    c10::impl::GenericDict fields;
  };
  std::vector<Group> groups;       // one per param group of the optimizer
  std::vector<at::Tensor> params;  // the optimizer's parameters, across groups in order
  std::vector<size_t> group_of;    // by parameter
  std::vector<Entry> entries;      // the parameters that have state, in the dict's order
};

// Checks the outline and throws stowage::InvalidArgument, with messages that start with
// `where`, unless: "state" is a dict and "param_groups" a list with one dict per param
// group, each with a "params" list of as many ids as the group has parameters; every key
// of "state" is a parameter index in range and every value a dict. The options and the
// state fields are left to the caller (see the field readers below).
OptimizerLayout read_optimizer_layout(const StateDict& state, torch::optim::Optimizer& optimizer,
                                      const std::string& where);

// The layout of `optimizer`: `write_options` fills each param group's dict (before its
// "params"); `write_entry` fills a parameter's state fields and returns false when the
// parameter has no state.
StateDict write_optimizer_layout(
    torch::optim::Optimizer& optimizer,
    const std::function<void(const torch::optim::OptimizerOptions&, c10::impl::GenericDict&)>& write_options,
    const std::function<bool(const at::Tensor& param, c10::impl::GenericDict& entry)>& write_entry);

// The parameter index a key of "state" spells, digits only ("0", "17"); nullopt for any
// other key.
std::optional<int64_t> parse_param_id(const std::string& key);

// Field readers: each throws stowage::InvalidArgument naming `where` and the key when the
// entry is missing or of another type.
c10::IValue require_entry(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where);
double require_number(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where);
bool require_bool(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where);
int64_t require_int(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where);
c10::impl::GenericDict require_dict(const c10::IValue& value, const std::string& where);
// A string-keyed dict of any values, as the layout's dicts are.
c10::impl::GenericDict new_layout_dict();

// Adam's and AdamW's options in a param group's dict: lr, betas, eps, weight_decay, amsgrad.
struct AdamOptionValues {
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool amsgrad = false;
};
void write_adam_options(const AdamOptionValues& options, c10::impl::GenericDict& group);
AdamOptionValues read_adam_options(const c10::impl::GenericDict& group, const std::string& where);

// The values of a torch::optim::AdamOptions or AdamWOptions (they share these setters
// and getters), and back.
template <typename AdamLikeOptions>
AdamOptionValues adam_option_values(const AdamLikeOptions& o) {
  return {o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.amsgrad()};
}
template <typename AdamLikeOptions>
void apply_adam_options(const AdamOptionValues& v, AdamLikeOptions& o) {
  o.lr(v.lr).betas(std::make_tuple(v.beta1, v.beta2)).eps(v.eps).weight_decay(v.weight_decay).amsgrad(v.amsgrad);
}

}  // namespace stowage
