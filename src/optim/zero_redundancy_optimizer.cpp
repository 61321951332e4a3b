#include <stowage/error.h>
#include <stowage/optim/partition.h>
#include <stowage/optim/zero_redundancy_optimizer.h>
#include <stowage/state/optimizer_adapter.h>
#include <stowage/state/optimizer_layout.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string>
#include <utility>

namespace stowage::optim {
namespace {

using GenericDict = c10::impl::GenericDict;

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
  if (ranks < 1 || static_cast<int64_t>(params.size()) < ranks) {
    throw InvalidArgument(
        fmt::format("cannot shard {} parameter tensors over {} ranks: every rank needs one", params.size(), ranks));
  }
  std::vector<int64_t> bytes;
  bytes.reserve(params.size());
  for (const at::Tensor& p : params) bytes.push_back(static_cast<int64_t>(p.nbytes()));
  std::vector<ParamRange> ranges;
  int64_t begin = 0;
  for (const int64_t count : partition_by_cost(bytes, ranks)) {
    ranges.push_back(ParamRange{begin, begin + count});
    begin += count;
  }
  // partition_by_cost makes at most `ranks` batches; with at least as many parameters
  // as ranks, exactly that many.
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(ranges.size()) == ranks);
  return ranges;
}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params, const OptimizerFactory& make_optimizer,
                                                 std::optional<dist::ProcessGroup> group,
                                                 ZeroRedundancyOptimizerOptions options)
    : params_(std::move(params)), group_(std::move(group)), rank_(group_ ? group_->rank() : 0) {
  // The broadcasts move each share as one flat buffer.
  dist::check_one_dtype_one_device(params_, "ZeroRedundancyOptimizer");
  shares_ = shard_parameters(params_, group_ ? group_->size() : 1);
  const ParamRange share = owned();
  local_ = make_optimizer(std::vector<at::Tensor>(params_.begin() + share.begin, params_.begin() + share.end));
  if (!local_ || local_->param_groups().size() != 1 ||
      static_cast<int64_t>(local_->param_groups().front().params().size()) != share.size()) {
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer: the optimizer factory must return an optimizer with one param group over the "
        "{} parameters it is given",
        share.size()));
  }
  if (options.swap()) {
    SwapOptimizerConfig swap = *options.swap();
    // With a group the gradients are reduced between backward and step(), so the host
    // update takes them at step(), once reduced.
    if (group_) swap.offload_gradients_in_backward(false);
    swap_ = swap_optimizer(local_, swap);
    local_state_ = swap_;
  } else {
    local_state_ = c10::make_intrusive<OptimizerState>(local_);
  }
}

void ZeroRedundancyOptimizer::step() {
  if (swap_) {
    swap_->step();
  } else {
    local_->step();
  }
  broadcast_shares();
}

int64_t ZeroRedundancyOptimizer::resident_state_bytes() const {
  if (swap_) return swap_->resident_state_bytes();
  const OptimizerAdapter* adapter = find_optimizer_adapter(*local_);  // OptimizerState checked it has one
  int64_t bytes = 0;
  for (const auto& item : local_->state()) {
    for (const at::Tensor* tensor : adapter->fields(*item.second).tensors) {
      if (tensor->defined()) bytes += tensor->numel() * static_cast<int64_t>(tensor->element_size());
    }
  }
  return bytes;
}

std::vector<int64_t> ZeroRedundancyOptimizer::owners() const {
  std::vector<int64_t> owner_of(params_.size());
  for (size_t rank = 0; rank < shares_.size(); ++rank) {
    for (int64_t i = shares_[rank].begin; i < shares_[rank].end; ++i) owner_of[i] = static_cast<int64_t>(rank);
  }
  return owner_of;
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (at::Tensor& p : params_) p.mutable_grad().reset();
  if (swap_) swap_->zero_grad();  // and the gradients its update on the host holds
}

void ZeroRedundancyOptimizer::broadcast_shares() {
  if (!group_ || group_->size() == 1) return;
  const at::NoGradGuard no_grad;
  for (size_t owner = 0; owner < shares_.size(); ++owner) {
    const ParamRange& share = shares_[owner];
    const bool mine = static_cast<int64_t>(owner) == rank_;
    std::vector<at::Tensor> flat;
    int64_t numel = 0;
    for (int64_t i = share.begin; i < share.end; ++i) {
      if (mine) flat.push_back(params_[i].reshape(-1));
      numel += params_[i].numel();
    }
    at::Tensor buffer = mine ? at::cat(flat) : at::empty({numel}, params_[share.begin].options());
    group_->broadcast(buffer, static_cast<int64_t>(owner));
    if (mine) continue;
    int64_t offset = 0;
    for (int64_t i = share.begin; i < share.end; ++i) {
      params_[i].copy_(buffer.narrow(0, offset, params_[i].numel()).view(params_[i].sizes()));
      offset += params_[i].numel();
    }
  }
}

StateDict ZeroRedundancyOptimizer::state_dict() {
  const ParamRange share = owned();
  const StateDict local = local_state_->state_dict();
  GenericDict states = new_layout_dict();
  for (const auto& item : require_dict(local.at("state"), "ZeroRedundancyOptimizer: the local optimizer's state")) {
    const std::optional<int64_t> id = parse_param_id(item.key().toStringRef());
    // The local optimizer's Stateful writes the layout itself: its keys are indices.
    TORCH_INTERNAL_ASSERT(id && *id < share.size(), "local state key ", item.key().toStringRef());
    states.insert(std::to_string(share.begin + *id), item.value());
  }
  StateDict state;
  state.insert("state", states);
  state.insert("param_groups", renumbered_groups(local.at("param_groups"), static_cast<int64_t>(params_.size()),
                                                 "ZeroRedundancyOptimizer: the local optimizer's param_groups"));
  return state;
}

StateDict ZeroRedundancyOptimizer::local_part(const StateDict& state) const {
  const std::string where = "ZeroRedundancyOptimizer load_state_dict";
  if (!state.contains("state") || !state.contains("param_groups")) {
    throw InvalidArgument(where + ": expected entries 'state' and 'param_groups'");
  }
  const c10::IValue groups = state.at("param_groups");
  if (!groups.isList() || groups.toList().size() != 1) {
    throw InvalidArgument(where + ": the saved optimizer must have exactly one param group, as this one has");
  }
  const std::string group_where = where + ": param_groups.0";
  const c10::IValue ids = require_entry(require_dict(groups.toList().get(0), group_where), "params", group_where);
  const auto total = static_cast<int64_t>(params_.size());
  if (!ids.isIntList() || static_cast<int64_t>(ids.toIntList().size()) != total) {
    throw InvalidArgument(fmt::format("{}: the saved optimizer has {} parameters, this one {}", where,
                                      ids.isIntList() ? std::to_string(ids.toIntList().size()) : "no list of", total));
  }
  const ParamRange share = owned();
  GenericDict states = new_layout_dict();
  for (const auto& item : require_dict(state.at("state"), where + ": 'state'")) {
    const std::optional<int64_t> id = parse_param_id(item.key().toStringRef());
    if (!id || *id >= total) {
      throw InvalidArgument(
          fmt::format("{}: state.{} is not one of the {} parameter ids", where, item.key().toStringRef(), total));
    }
    if (share.contains(*id)) states.insert(std::to_string(*id - share.begin), item.value());
  }
  StateDict local;
  local.insert("state", states);
  local.insert("param_groups", renumbered_groups(groups, share.size(), where + ": param_groups"));
  return local;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& state) {
  local_state_->load_state_dict(local_part(state));
}

void ZeroRedundancyOptimizer::check_load_state_dict(const StateDict& state) {
  local_state_->check_load_state_dict(local_part(state));
}

bool ZeroRedundancyOptimizer::needs_saved_entry(const ObjectPath& path) const {
  if (path.size() < 2) return true;
  const auto* section = std::get_if<std::string>(&path[0]);
  const auto* key = std::get_if<std::string>(&path[1]);
  if (section == nullptr || *section != "state" || key == nullptr) return true;
  // An unparsable key is loaded, for load_state_dict to reject by name.
  const std::optional<int64_t> id = parse_param_id(*key);
  return !id || owned().contains(*id);
}

}  // namespace stowage::optim
