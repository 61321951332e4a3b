#include "train_sharding.h"

#include <stowage/error.h>
#include <stowage/optim/partition.h>
#include <stowage/state/optimizer_layout.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string>

namespace stowage::cli {
namespace {

using GenericDict = c10::impl::GenericDict;

// The non-negative integer spelled by `text` exactly, or -1.
int64_t parse_id(const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(text);
}

// A copy of the single param group of `groups`, listing `count` parameters from 0.
c10::impl::GenericList renumbered_groups(const c10::IValue& groups, int64_t count, const std::string& where) {
  if (!groups.isList() || groups.toList().size() != 1) {
    throw InvalidArgument(fmt::format("{}: expected a list of exactly one param group", where));
  }
  GenericDict group = require_dict(groups.toList().get(0), where + ".0").copy();
  c10::List<int64_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(i);
  group.insert_or_assign("params", ids);
  c10::impl::GenericList result(c10::AnyType::get());
  result.push_back(group);
  return result;
}

}  // namespace

std::vector<ParamRange> shard_parameters(const std::vector<at::Tensor>& params, int64_t ranks) {
  if (static_cast<int64_t>(params.size()) < ranks) {
    throw InvalidArgument(
        fmt::format("cannot shard {} parameter tensors over {} ranks: every rank needs one", params.size(), ranks));
  }
  std::vector<int64_t> bytes;
  for (const at::Tensor& p : params) bytes.push_back(static_cast<int64_t>(p.nbytes()));
  std::vector<ParamRange> ranges;
  int64_t begin = 0;
  for (const int64_t count : optim::partition_by_cost(bytes, ranks)) {
    ranges.push_back(ParamRange{begin, begin + count});
    begin += count;
  }
  // partition_by_cost makes at most `ranks` batches; with at least as many parameters
  // as ranks, exactly that many.
  if (static_cast<int64_t>(ranges.size()) != ranks) {
    throw Error(fmt::format("sharding {} parameters over {} ranks gave {} ranges", params.size(), ranks, ranges.size()));
  }
  return ranges;
}

ShardedOptimizerState::ShardedOptimizerState(c10::intrusive_ptr<Stateful> local, ParamRange owned,
                                             int64_t total_params)
    : local_(std::move(local)), owned_(owned), total_params_(total_params) {}

StateDict ShardedOptimizerState::state_dict() {
  const StateDict local = local_->state_dict();
  GenericDict states = new_layout_dict();
  for (const auto& item : require_dict(local.at("state"), "local optimizer state")) {
    const int64_t id = parse_id(item.key().toStringRef());
    states.insert(std::to_string(owned_.begin + id), item.value());
  }
  StateDict state;
  state.insert("state", states);
  state.insert("param_groups", renumbered_groups(local.at("param_groups"), total_params_, "local optimizer"));
  return state;
}

void ShardedOptimizerState::load_state_dict(const StateDict& state) {
  const std::string where = "optimizer load_state_dict";
  if (!state.contains("state") || !state.contains("param_groups")) {
    throw InvalidArgument(where + ": expected entries 'state' and 'param_groups'");
  }
  const c10::IValue groups = state.at("param_groups");
  if (!groups.isList() || groups.toList().size() != 1) {
    throw InvalidArgument(where + ": the checkpoint's optimizer must have exactly one param group, as train's has");
  }
  const std::string group_where = where + ": param_groups.0";
  const c10::IValue ids = require_entry(require_dict(groups.toList().get(0), group_where), "params", group_where);
  if (!ids.isIntList() || static_cast<int64_t>(ids.toIntList().size()) != total_params_) {
    throw InvalidArgument(fmt::format("{}: the checkpoint's optimizer has {} parameters, this model {}", where,
                                      ids.isIntList() ? std::to_string(ids.toIntList().size()) : "no list of",
                                      total_params_));
  }
  GenericDict states = new_layout_dict();
  for (const auto& item : require_dict(state.at("state"), where + ": 'state'")) {
    const int64_t id = parse_id(item.key().toStringRef());
    if (id < 0 || id >= total_params_) {
      throw InvalidArgument(fmt::format("{}: state.{} is not one of the {} parameter ids", where,
                                        item.key().toStringRef(), total_params_));
    }
    if (id >= owned_.begin && id < owned_.end) states.insert(std::to_string(id - owned_.begin), item.value());
  }
  StateDict local;
  local.insert("state", states);
  local.insert("param_groups", renumbered_groups(groups, owned_.size(), where + ": param_groups"));
  local_->load_state_dict(local);
}

StateDict ShardedOptimizerState::load_request(const dcp::Metadata& metadata, const std::string& key) const {
  FlatStateDict request;
  for (const dcp::EntryMetadata& entry : metadata.entries) {
    const ObjectPath& path = entry.path;
    if (path.size() < 2 || std::get<std::string>(path[0]) != key) continue;
    const auto* section = std::get_if<std::string>(&path[1]);
    if (section != nullptr && *section == "state" && path.size() > 2) {
      const auto* id_text = std::get_if<std::string>(&path[2]);
      const int64_t id = id_text != nullptr ? parse_id(*id_text) : -1;
      if (id >= 0 && (id < owned_.begin || id >= owned_.end)) continue;  // another rank's
    }
    // A placeholder of the saved kind, which the load replaces or fills.
    c10::IValue placeholder;
    if (entry.kind == dcp::EntryKind::kTensor) {
      placeholder = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
    }
    request.add(FlatEntry{entry.fqn, path, placeholder});
  }
  const StateDict nested = unflatten_state_dict(request);
  if (!nested.contains(key)) {
    throw InvalidArgument(fmt::format("the checkpoint has no entry '{}'", key));
  }
  return StateDict(nested.at(key).toGenericDict());
}

DataParallel::DataParallel(dcp::ProcessGroup group, std::vector<at::Tensor> params, std::vector<ParamRange> ranges)
    : group_(std::move(group)), params_(std::move(params)), ranges_(std::move(ranges)) {
  // The collectives move flat buffers, concatenations of the parameters.
  for (const at::Tensor& p : params_) {
    if (p.scalar_type() != params_.front().scalar_type() || p.device() != params_.front().device()) {
      throw InvalidArgument("data parallelism needs every parameter on one device with one dtype");
    }
  }
}

void DataParallel::average_gradients() {
  // One collective for all gradients: a flat buffer, summed, then scaled and copied back.
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : params_) {
    flat.push_back(p.grad().defined() ? p.grad().reshape(-1) : at::zeros({p.numel()}, p.options()));
  }
  at::Tensor buffer = at::cat(flat);
  group_.all_reduce_sum(buffer);
  buffer.div_(static_cast<double>(group_.size()));
  int64_t offset = 0;
  for (at::Tensor& p : params_) {
    const at::Tensor mean = buffer.narrow(0, offset, p.numel()).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(mean);
    } else {
      p.mutable_grad() = mean.clone();
    }
    offset += p.numel();
  }
}

void DataParallel::share_parameters() {
  const at::NoGradGuard no_grad;
  for (size_t owner = 0; owner < ranges_.size(); ++owner) {
    const ParamRange& range = ranges_[owner];
    std::vector<at::Tensor> flat;
    int64_t numel = 0;
    for (int64_t i = range.begin; i < range.end; ++i) {
      flat.push_back(params_[i].reshape(-1));
      numel += params_[i].numel();
    }
    const bool mine = static_cast<int64_t>(owner) == group_.rank();
    at::Tensor buffer = mine ? at::cat(flat) : at::empty({numel}, params_[range.begin].options());
    group_.broadcast(buffer, static_cast<int64_t>(owner));
    if (mine) continue;
    int64_t offset = 0;
    for (int64_t i = range.begin; i < range.end; ++i) {
      params_[i].copy_(buffer.narrow(0, offset, params_[i].numel()).view(params_[i].sizes()));
      offset += params_[i].numel();
    }
  }
}

double DataParallel::average(double value) {
  at::Tensor buffer = at::full({1}, value, at::kDouble);
  group_.all_reduce_sum(buffer);
  return buffer.item<double>() / static_cast<double>(group_.size());
}

}  // namespace stowage::cli
