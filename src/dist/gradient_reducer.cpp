#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include "dist/module_buffers.h"
#include "util/intra_op_threads.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace stowage::dist {
namespace detail {

// Not in the anonymous namespace: GradientReducer::State holds these types.

// A bucket's parameters' gradients, side by side in one flat tensor.
struct Bucket {
  std::vector<size_t> params;
  std::vector<int64_t> offsets;  // by slot: where its parameter's gradient starts in `flat`
  int64_t numel = 0;
  int64_t owner = -1;  // the rank its mean goes to; -1: every rank
  // Whether `flat` lives from step to step, as the gradients' storage (every bucket
  // without owners, and the buckets this rank owns); otherwise it is made when the first
  // gradient arrives and dropped once reduced.
  bool kept = true;
  at::Tensor flat;
};

// A gradient the reducer cannot reduce.
enum class Misuse : int64_t {
  kNone = 0,
  kAfterSent = 1,  // it arrived after its bucket was sent
  kWithGraph = 2,  // it came from a backward with create_graph=true
};

}  // namespace detail

namespace {

using detail::Bucket;
using detail::Misuse;
using detail::ModuleBuffers;
using detail::TensorShape;

void check_params(const std::vector<at::Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) {
      throw InvalidArgument(fmt::format("GradientReducer: parameter {} is not a leaf tensor that requires grad", i));
    }
  }
  // The collectives move each bucket as one flat buffer.
  check_one_dtype_one_device(params, "GradientReducer");
}

// One owner per parameter, each a rank of the group; or none.
void check_owners(const std::vector<int64_t>& owners, size_t params, int64_t ranks) {
  if (owners.empty()) return;
  if (owners.size() != params) {
    throw InvalidArgument(
        fmt::format("GradientReducer: gradient_owners names {} owners for {} parameters", owners.size(), params));
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] < 0 || owners[i] >= ranks) {
      throw InvalidArgument(
          fmt::format("GradientReducer: gradient_owners gives parameter {} to rank {}, not a rank of "
                      "this group of {}",
                      i, owners[i], ranks));
    }
  }
}

// The parameters from last to first, cut into buckets of up to `cap_bytes` (one
// parameter at least each) of one owner each.
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, const std::vector<int64_t>& owners,
                                 int64_t cap_bytes, int64_t rank) {
  std::vector<Bucket> buckets;
  int64_t bucket_bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const auto bytes = static_cast<int64_t>(params[i].nbytes());
    const int64_t owner = owners.empty() ? -1 : owners[i];
    if (buckets.empty() || bucket_bytes + bytes > cap_bytes || buckets.back().owner != owner) {
      buckets.emplace_back();
      buckets.back().owner = owner;
      buckets.back().kept = owner < 0 || owner == rank;
      bucket_bytes = 0;
    }
    Bucket& bucket = buckets.back();
    bucket.params.push_back(i);
    bucket.offsets.push_back(bucket.numel);
    bucket.numel += params[i].numel();
    bucket_bytes += bytes;
  }
  return buckets;
}

// The name of the group the reducer's collectives run on: one per reducer made on
// `group`, the same on every rank since each rank makes them in the same order.
std::string reducer_group_name(const ProcessGroup& group) {
  const auto made = std::static_pointer_cast<int64_t>(
      group.attachment("dist.gradient_reducers", [] { return std::make_shared<int64_t>(0); }));
  return fmt::format("gradient_reducer_{}", (*made)++);
}

std::string misuse_message(Misuse misuse, int64_t param, int64_t rank) {
  if (misuse == Misuse::kWithGraph) {
    return fmt::format(
        "GradientReducer: parameter {} got its gradient from a backward with create_graph=true, on rank {}: the "
        "reducer's gradients are plain data, the means of the ranks', without a graph",
        param, rank);
  }
  return fmt::format(
      "GradientReducer: parameter {} got a gradient after its bucket was sent, on rank {} (a parameter used in two "
      "backward calls of one step, e.g. shared across reentrant checkpoints, cannot be reduced during backward)",
      param, rank);
}

}  // namespace

// What the hooks, the communication thread and the methods share. The hooks run on the
// backward's threads, the collectives on `worker`; `mutex` guards the fields below it.
struct GradientReducer::State {
  State(std::vector<at::Tensor> parameters, ModuleBuffers module_buffers, ProcessGroup reducer_group,
        GradientReducerOptions reducer_options)
      : params(std::move(parameters)),
        buffers(std::move(module_buffers)),
        group(std::move(reducer_group)),
        options(std::move(reducer_options)) {}

  const std::vector<at::Tensor> params;
  ModuleBuffers buffers;
  const ProcessGroup group;
  const GradientReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;    // by parameter
  std::vector<size_t> slot_of;      // by parameter: its place in its bucket
  std::vector<TensorShape> shapes;  // by parameter: when the reducer was made
  // Each parameter's AccumulateGrad node (kept alive, as the parameter holds it weakly) and
  // the key of the hook on it.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> arrived;    // by parameter: its gradient is in its bucket, this backward
  std::vector<size_t> waiting;  // by bucket: parameters whose gradient has not arrived
  size_t sent = 0;              // buckets [0, sent) are handed to the worker, in order
  size_t reduced = 0;           // buckets [0, reduced) are reduced
  bool stopping = false;
  std::exception_ptr failure;  // of a collective
  // The first gradient this rank could not reduce, this backward: its parameter (-1: none).
  int64_t misused = -1;
  Misuse misuse = Misuse::kNone;

  // Parameter `param`'s slot in its bucket, shaped as the parameter, and strided as it
  // when it is dense (so that autograd's gradient layout contract holds, as in DDP).
  // REQUIRES: the bucket's flat exists.
  at::Tensor slot(size_t param) const {
    const Bucket& bucket = buckets[bucket_of[param]];
    const at::Tensor& p = params[param];
    const int64_t offset = bucket.offsets[slot_of[param]];
    if (p.is_non_overlapping_and_dense()) {
      return bucket.flat.as_strided(p.sizes(), p.strides(), bucket.flat.storage_offset() + offset);
    }
    return bucket.flat.narrow(0, offset, p.numel()).view(p.sizes());
  }

  // Sets a slot to a gradient, dense or sparse (an Embedding's with sparse=true).
  static void assign(const at::Tensor& slot, const at::Tensor& grad) {
    if (grad.is_sparse()) {
      slot.zero_();
      slot.add_(grad);
    } else {
      slot.copy_(grad);
    }
  }

  static bool is_view_of(const at::Tensor& grad, const at::Tensor& slot) {
    return grad.defined() && !grad.is_sparse() && grad.is_alias_of(slot) && grad.data_ptr() == slot.data_ptr() &&
           grad.sizes() == slot.sizes() && grad.strides() == slot.strides();
  }

  // Makes the flat tensor of a bucket that lives for one backward (zeros: a parameter
  // without a gradient counts as zeros).
  void materialise(Bucket& bucket) {
    if (!bucket.flat.defined()) bucket.flat = at::zeros({bucket.numel}, params[bucket.params.front()].options());
  }

  // Points `param`'s gradient at its slot, with gradient_as_bucket_view. REQUIRES: its
  // bucket is kept.
  void attach(size_t param) {
    if (!options.gradient_as_bucket_view()) return;
    at::Tensor p = params[param];
    const at::Tensor view = slot(param);
    if (!is_view_of(p.grad(), view)) p.mutable_grad() = view;
  }

  // Throws InvalidArgument naming a parameter whose shape, dtype or device changed, or
  // that no longer requires grad.
  void check_unchanged() const {
    for (size_t i = 0; i < params.size(); ++i) {
      detail::check_shape_unchanged(params[i], shapes[i], "parameter", i);
      if (!params[i].requires_grad()) {
        throw InvalidArgument(fmt::format("GradientReducer: parameter {} no longer requires grad", i));
      }
    }
    buffers.check_unchanged();
  }

  // Moves each hook to its parameter's AccumulateGrad node if the parameter has a new one
  // (set_data to another dtype or device and back, as a Module::to round trip does, drops
  // the node). Returns the parameters whose hook moved. REQUIRES: no backward runs.
  std::vector<size_t> follow_accumulators_locked(const std::shared_ptr<State>& self) {
    std::vector<size_t> moved;
    for (size_t i = 0; i < params.size(); ++i) {
      std::shared_ptr<torch::autograd::Node> now = torch::autograd::impl::grad_accumulator(params[i]);
      if (now == accumulators[i]) continue;
      accumulators[i]->del_post_hook(hook_keys[i]);
      hook_keys[i] = now->add_post_hook(std::make_unique<GradientArrived>(self, i));
      accumulators[i] = std::move(now);
      moved.push_back(i);
    }
    return moved;
  }

  void reset_locked() {
    for (Bucket& bucket : buckets) {
      if (!bucket.kept) bucket.flat = at::Tensor();
    }
    std::fill(arrived.begin(), arrived.end(), false);
    for (size_t b = 0; b < buckets.size(); ++b) waiting[b] = buckets[b].params.size();
    sent = 0;
    reduced = 0;
    failure = nullptr;
    misused = -1;
    misuse = Misuse::kNone;
  }

  // Hands the worker every complete bucket that follows the ones already sent.
  void send_ready_locked() {
    const size_t before = sent;
    while (sent < buckets.size() && waiting[sent] == 0) ++sent;
    if (sent != before) changed.notify_all();
  }

  // Counts `param`'s gradient as arrived. Its bucket takes it: in place when the gradient
  // is its slot already; otherwise copied (or, when it arrived before, added) into it.
  void take_gradient_locked(size_t param) {
    Bucket& bucket = buckets[bucket_of[param]];
    at::Tensor p = params[param];
    const at::Tensor& grad = p.grad();
    if (!bucket.kept) materialise(bucket);
    const at::Tensor view = slot(param);
    const at::NoGradGuard no_grad;
    if (grad.defined() && !is_view_of(grad, view)) {
      if (arrived[param] && !bucket.kept) {
        view.add_(grad);  // a second gradient of a parameter this rank does not keep
      } else {
        assign(view, grad);  // the caller's gradient, accumulated outside the bucket
      }
    } else if (!grad.defined() && !arrived[param]) {
      view.zero_();  // no gradient (a Function returned none): zeros, not what a reset .grad() left
    }
    if (bucket.kept) {
      attach(param);
    } else {
      p.mutable_grad().reset();
    }
    if (arrived[param]) return;
    arrived[param] = true;
    --waiting[bucket_of[param]];
  }

  // Called once autograd has accumulated `param`'s gradient of this backward.
  void on_gradient(size_t param) {
    std::lock_guard<std::mutex> lock(mutex);
    // A backward with create_graph=true gives gradients with a graph, which the reducer
    // (whose buckets are data) would silently detach.
    const Misuse problem = at::GradMode::is_enabled() ? Misuse::kWithGraph
                           : bucket_of[param] < sent  ? Misuse::kAfterSent
                                                      : Misuse::kNone;
    if (problem != Misuse::kNone && misused < 0) {
      misused = static_cast<int64_t>(param);
      misuse = problem;
    }
    if (bucket_of[param] < sent) return;  // the worker may be reducing it
    take_gradient_locked(param);
    if (options.overlap()) send_ready_locked();
  }

  void run_worker() {
    util::run_aten_serially_on_this_thread();
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      changed.wait(lock, [&] { return stopping || reduced < sent; });
      if (stopping) return;
      Bucket& bucket = buckets[reduced];
      at::Tensor flat = bucket.flat;
      const int64_t owner = bucket.owner;
      const bool failed = failure != nullptr;
      lock.unlock();
      std::exception_ptr error;
      if (!failed) {  // after a failure the group is out of step: the rest are skipped
        try {
          if (owner < 0) {
            group.all_reduce_sum(flat);
          } else {
            group.reduce_sum(flat, owner);
          }
        } catch (...) {
          error = std::current_exception();
        }
      }
      flat = at::Tensor();
      lock.lock();
      if (!bucket.kept) bucket.flat = at::Tensor();  // another rank's: gone once reduced
      if (error) failure = error;
      ++reduced;
      changed.notify_all();
    }
  }

  // Tells the reducer that autograd has accumulated a parameter's gradient: a post-hook
  // on the parameter's AccumulateGrad node (a tensor hook would see the gradient before it
  // is accumulated into the bucket).
  class GradientArrived final : public torch::autograd::FunctionPostHook {
   public:
    GradientArrived(std::weak_ptr<State> state, size_t param) : state_(std::move(state)), param_(param) {}

    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      if (const auto state = state_.lock()) state->on_gradient(param_);
      return outputs;
    }

   private:
    std::weak_ptr<State> state_;
    size_t param_;
  };

  std::thread worker;
};

GradientReducer::GradientReducer(std::vector<at::Tensor> params, const ProcessGroup& group,
                                 GradientReducerOptions options)
    : GradientReducer(std::move(params), {}, group, std::move(options)) {}

GradientReducer::GradientReducer(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                                 const ProcessGroup& group, GradientReducerOptions options) {
  if (params.empty()) throw InvalidArgument("GradientReducer: no parameters");
  check_params(params);
  if (!(options.bucket_cap_mb() > 0)) {
    throw InvalidArgument(fmt::format("GradientReducer: bucket_cap_mb must be > 0, got {}", options.bucket_cap_mb()));
  }
  check_owners(options.gradient_owners(), params.size(), group.size());
  ModuleBuffers module_buffers(std::move(buffers));  // before the collective new_group: it may throw
  state_ = std::make_shared<State>(std::move(params), std::move(module_buffers),
                                   group.new_group(reducer_group_name(group)), options);
  State& s = *state_;
  // Before any hook is set: it may throw (a failed collective).
  if (s.options.broadcast_buffers()) s.buffers.broadcast_from_rank0(s.group);
  s.buckets = make_buckets(s.params, s.options.gradient_owners(),
                           static_cast<int64_t>(options.bucket_cap_mb() * 1024 * 1024), group.rank());
  s.bucket_of.resize(s.params.size());
  s.slot_of.resize(s.params.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    Bucket& bucket = s.buckets[b];
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      s.bucket_of[bucket.params[k]] = b;
      s.slot_of[bucket.params[k]] = k;
    }
    if (bucket.kept) bucket.flat = at::zeros({bucket.numel}, s.params[bucket.params.front()].options());
  }
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.shapes.emplace_back(s.params[i]);
    if (!s.buckets[s.bucket_of[i]].kept || !s.options.gradient_as_bucket_view()) continue;
    const at::Tensor& grad = s.params[i].grad();
    if (grad.defined()) s.slot(i).copy_(grad);
    s.attach(i);
  }
  s.arrived.resize(s.params.size());
  s.waiting.resize(s.buckets.size());
  s.reset_locked();
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.accumulators.push_back(torch::autograd::impl::grad_accumulator(s.params[i]));
    s.hook_keys.push_back(s.accumulators.back()->add_post_hook(std::make_unique<State::GradientArrived>(state_, i)));
  }
  // Last: a State destroyed with a joinable thread would terminate the process.
  s.worker = std::thread([&s] { s.run_worker(); });
}

GradientReducer::~GradientReducer() {
  State& s = *state_;
  for (size_t i = 0; i < s.accumulators.size(); ++i) s.accumulators[i]->del_post_hook(s.hook_keys[i]);
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
    s.changed.notify_all();
  }
  s.worker.join();
}

void GradientReducer::zero_grad() {
  State& s = *state_;
  s.check_unchanged();
  const at::NoGradGuard no_grad;
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.follow_accumulators_locked(state_);
  for (Bucket& bucket : s.buckets) {
    if (bucket.kept) bucket.flat.zero_();
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    at::Tensor param = s.params[i];
    if (!s.buckets[s.bucket_of[i]].kept) {
      param.mutable_grad().reset();
    } else if (s.options.gradient_as_bucket_view()) {
      s.attach(i);
    } else if (param.grad().defined()) {
      param.mutable_grad().zero_();
    }
  }
}

void GradientReducer::synchronize() {
  State& s = *state_;
  s.check_unchanged();
  std::unique_lock<std::mutex> lock(s.mutex);
  // A parameter whose node changed since zero_grad() had its gradient accumulated unseen.
  for (const size_t i : s.follow_accumulators_locked(state_)) {
    if (!s.arrived[i] && s.params[i].grad().defined()) s.take_gradient_locked(i);
  }
  // What the hooks did not bring: a parameter without a gradient counts as zeros.
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.arrived[i]) continue;
    Bucket& bucket = s.buckets[s.bucket_of[i]];  // not sent yet: a bucket is sent once complete
    if (bucket.kept) {
      s.slot(i).zero_();
      s.attach(i);
    } else {
      s.materialise(bucket);
      s.params[i].mutable_grad().reset();
    }
    s.arrived[i] = true;
    --s.waiting[s.bucket_of[i]];
  }
  s.send_ready_locked();
  s.changed.wait(lock, [&] { return s.reduced == s.buckets.size(); });
  const std::exception_ptr failure = s.failure;
  const int64_t misused = s.misused;
  const Misuse misuse = s.misuse;
  s.reset_locked();
  if (failure) std::rethrow_exception(failure);
  lock.unlock();
  // Every rank learns of a gradient any rank could not reduce: the buckets it went into
  // were reduced into every rank's (or the owner's) gradients. Per rank: parameter + 1, kind.
  const int64_t rank = s.group.rank();
  at::Tensor verdicts = at::zeros({2 * s.group.size()}, at::kLong);
  verdicts[2 * rank] = misused + 1;
  verdicts[2 * rank + 1] = static_cast<int64_t>(misuse);
  s.group.all_reduce_sum(verdicts);
  const auto verdict = verdicts.accessor<int64_t, 1>();
  for (int64_t r = 0; r < s.group.size(); ++r) {
    if (verdict[2 * r] > 0) {
      throw InvalidArgument(misuse_message(static_cast<Misuse>(verdict[2 * r + 1]), verdict[2 * r] - 1, r));
    }
  }

  const at::NoGradGuard no_grad;
  const auto ranks = static_cast<double>(s.group.size());
  for (Bucket& bucket : s.buckets) {
    if (!bucket.kept) continue;
    bucket.flat.div_(ranks);
    for (const size_t i : bucket.params) {
      if (s.options.gradient_as_bucket_view()) {
        s.attach(i);  // a .grad() the caller replaced after backward
        continue;
      }
      at::Tensor param = s.params[i];
      const at::Tensor mean = s.slot(i);
      if (param.grad().defined() && param.grad().layout() == mean.layout()) {
        param.mutable_grad().copy_(mean);
      } else {
        param.mutable_grad() = mean.clone();  // undefined, or sparse (the mean is dense)
      }
    }
  }
  if (s.options.broadcast_buffers()) s.buffers.broadcast_from_rank0(s.group);
}

void GradientReducer::broadcast_buffers() {
  State& s = *state_;
  s.buffers.check_unchanged();
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    const auto pending = std::find(s.arrived.begin(), s.arrived.end(), true);
    if (pending != s.arrived.end()) {
      throw InvalidArgument(fmt::format(
          "GradientReducer: broadcast_buffers() between a backward and its synchronize() (parameter {} has its "
          "gradient pending); call it before backward or after synchronize()",
          pending - s.arrived.begin()));
    }
  }
  s.buffers.broadcast_from_rank0(s.group);
}

std::vector<std::vector<size_t>> GradientReducer::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : state_->buckets) out.push_back(bucket.params);
  return out;
}

int64_t GradientReducer::kept_bucket_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : state_->buckets) {
    if (bucket.kept) bytes += static_cast<int64_t>(bucket.flat.nbytes());
  }
  return bytes;
}

}  // namespace stowage::dist
