#include <stowage/error.h>
#include <stowage/state/optimizer_layout.h>

#include "util/decimal.h"

#include <torch/optim/optimizer.h>

#include <fmt/format.h>

#include <optional>

namespace stowage {

c10::impl::GenericDict new_layout_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

std::optional<int64_t> parse_param_id(const std::string& key) {
  return parse_decimal_digits(key);
}

c10::IValue require_entry(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const auto it = dict.find(key);
  if (it == dict.end()) {
    throw InvalidArgument(fmt::format("{}: missing entry '{}'", where, key));
  }
  return it->value();
}

double require_number(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require_entry(dict, key, where);
  if (!v.isDouble() && !v.isInt()) {
    throw InvalidArgument(fmt::format("{}: entry '{}' must be a number, got {}", where, key, v.tagKind()));
  }
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

bool require_bool(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require_entry(dict, key, where);
  if (!v.isBool()) {
    throw InvalidArgument(fmt::format("{}: entry '{}' must be a bool, got {}", where, key, v.tagKind()));
  }
  return v.toBool();
}

int64_t require_int(const c10::impl::GenericDict& dict, const std::string& key, const std::string& where) {
  const c10::IValue v = require_entry(dict, key, where);
  if (!v.isInt()) {
    throw InvalidArgument(fmt::format("{}: '{}' must be an int, got {}", where, key, v.tagKind()));
  }
  return v.toInt();
}

c10::impl::GenericDict require_dict(const c10::IValue& value, const std::string& where) {
  if (!value.isGenericDict()) {
    throw InvalidArgument(fmt::format("{} must be a dict, got {}", where, value.tagKind()));
  }
  return value.toGenericDict();
}

OptimizerLayout read_optimizer_layout(const StateDict& state, torch::optim::Optimizer& optimizer,
                                      const std::string& where) {
  if (!state.contains("state") || !state.contains("param_groups")) {
    throw InvalidArgument(where + ": expected entries 'state' and 'param_groups'");
  }
  const auto per_param = require_dict(state.at("state"), where + ": 'state'");
  const c10::IValue groups_value = state.at("param_groups");
  if (!groups_value.isList()) {
    throw InvalidArgument(where + ": 'param_groups' must be a list");
  }
  const auto groups = groups_value.toList();
  auto& param_groups = optimizer.param_groups();
  if (groups.size() != param_groups.size()) {
    throw InvalidArgument(
        fmt::format("{}: the state has {} param groups, the optimizer {}", where, groups.size(), param_groups.size()));
  }

  OptimizerLayout layout;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string group_where = fmt::format("{}: param_groups.{}", where, g);
    OptimizerLayout::Group group{group_where, require_dict(groups.get(g), group_where)};
    const c10::IValue ids = require_entry(group.options, "params", group.where);
    const size_t expected = param_groups[g].params().size();
    if (!ids.isIntList() || ids.toIntList().size() != expected) {
      throw InvalidArgument(fmt::format("{}: 'params' must list {} parameter ids", group.where, expected));
    }
    for (const at::Tensor& p : param_groups[g].params()) {
      layout.params.push_back(p);
      layout.group_of.push_back(g);
    }
    layout.groups.push_back(std::move(group));
  }
  for (const auto& item : per_param) {
    const std::string id = item.key().toStringRef();
    std::string entry_where = fmt::format("{}: state.{}", where, id);
    const std::optional<int64_t> parsed = parse_param_id(id);
    if (!parsed) throw InvalidArgument(entry_where + ": the key is not a parameter id");
    const auto param = static_cast<size_t>(*parsed);
    if (param >= layout.params.size()) {
      throw InvalidArgument(fmt::format("{}: there are only {} parameters", entry_where, layout.params.size()));
    }
    c10::impl::GenericDict fields = require_dict(item.value(), entry_where);
    layout.entries.push_back({param, std::move(entry_where), fields});  // a Dict copies (shares) on move too
  }
  return layout;
}

StateDict write_optimizer_layout(
    torch::optim::Optimizer& optimizer,
    const std::function<void(const torch::optim::OptimizerOptions&, c10::impl::GenericDict&)>& write_options,
    const std::function<bool(const at::Tensor& param, c10::impl::GenericDict& entry)>& write_entry) {
  auto per_param = new_layout_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto group_dict = new_layout_dict();
    write_options(group.options(), group_dict);
    c10::List<int64_t> ids;
    for (const at::Tensor& param : group.params()) {
      auto entry = new_layout_dict();
      if (write_entry(param, entry)) per_param.insert(std::to_string(index), entry);
      ids.push_back(index++);
    }
    group_dict.insert("params", ids);
    groups.push_back(group_dict);
  }
  StateDict state;
  state.insert("state", per_param);
  state.insert("param_groups", groups);
  return state;
}

void write_adam_options(const AdamOptionValues& options, c10::impl::GenericDict& group) {
  group.insert("lr", options.lr);
  group.insert("betas", c10::List<double>({options.beta1, options.beta2}));
  group.insert("eps", options.eps);
  group.insert("weight_decay", options.weight_decay);
  group.insert("amsgrad", options.amsgrad);
}

AdamOptionValues read_adam_options(const c10::impl::GenericDict& group, const std::string& where) {
  AdamOptionValues options;
  options.lr = require_number(group, "lr", where);
  const c10::IValue betas = require_entry(group, "betas", where);
  if (!betas.isDoubleList() || betas.toDoubleList().size() != 2) {
    throw InvalidArgument(fmt::format("{}: entry 'betas' must be a list of two doubles", where));
  }
  options.beta1 = betas.toDoubleList().get(0);
  options.beta2 = betas.toDoubleList().get(1);
  options.eps = require_number(group, "eps", where);
  options.weight_decay = require_number(group, "weight_decay", where);
  options.amsgrad = require_bool(group, "amsgrad", where);
  return options;
}

}  // namespace stowage
