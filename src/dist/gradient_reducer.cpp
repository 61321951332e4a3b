#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace stowage::dist {
namespace detail {

// A bucket's parameters' gradients, side by side in one flat tensor. (Not in the
// anonymous namespace: GradientReducer::State holds them.)
struct Bucket {
  std::vector<size_t> params;
  std::vector<at::Tensor> slots;  // views of `flat`, one per parameter, flat-shaped
  at::Tensor flat;
};

}  // namespace detail

namespace {

using detail::Bucket;

void check_params(const std::vector<at::Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) {
      throw InvalidArgument(fmt::format("GradientReducer: parameter {} is not a leaf tensor that requires grad", i));
    }
  }
  // The all-reduces move each bucket as one flat buffer.
  check_one_dtype_one_device(params, "GradientReducer");
}

// The parameters from last to first, cut into buckets of up to `cap_bytes` (one
// parameter at least each).
std::vector<Bucket> make_buckets(const std::vector<at::Tensor>& params, int64_t cap_bytes) {
  std::vector<Bucket> buckets;
  int64_t bucket_bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    const auto bytes = static_cast<int64_t>(params[i].nbytes());
    if (buckets.empty() || bucket_bytes + bytes > cap_bytes) {
      buckets.emplace_back();
      bucket_bytes = 0;
    }
    buckets.back().params.push_back(i);
    bucket_bytes += bytes;
  }
  for (Bucket& bucket : buckets) {
    int64_t numel = 0;
    for (const size_t i : bucket.params) numel += params[i].numel();
    bucket.flat = at::zeros({numel}, params[bucket.params.front()].options());
    int64_t offset = 0;
    for (const size_t i : bucket.params) {
      bucket.slots.push_back(bucket.flat.narrow(0, offset, params[i].numel()));
      offset += params[i].numel();
    }
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

}  // namespace

// What the hooks, the communication thread and synchronize() share. The hooks run on
// the backward's threads, the all-reduces on `worker`; `mutex` guards the fields below it.
struct GradientReducer::State {
  State(std::vector<at::Tensor> parameters, ProcessGroup reducer_group, GradientReducerOptions reducer_options)
      : params(std::move(parameters)), group(std::move(reducer_group)), options(reducer_options) {}

  const std::vector<at::Tensor> params;
  const ProcessGroup group;
  const GradientReducerOptions options;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;  // by parameter
  std::vector<size_t> slot_of;    // by parameter: its place in its bucket

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> arrived;    // by parameter: its gradient is in its slot, this backward
  std::vector<size_t> waiting;  // by bucket: parameters whose gradient has not arrived
  size_t sent = 0;              // buckets [0, sent) are handed to the worker, in order
  size_t reduced = 0;           // buckets [0, reduced) are all-reduced
  bool stopping = false;
  std::exception_ptr failure;  // of an all-reduce
  std::string misuse;          // a gradient that came after its bucket was sent

  void reset_locked() {
    std::fill(arrived.begin(), arrived.end(), false);
    for (size_t b = 0; b < buckets.size(); ++b) waiting[b] = buckets[b].params.size();
    sent = 0;
    reduced = 0;
    failure = nullptr;
    misuse.clear();
  }

  // Hands the worker every complete bucket that follows the ones already sent.
  void send_ready_locked() {
    const size_t before = sent;
    while (sent < buckets.size() && waiting[sent] == 0) ++sent;
    if (sent != before) changed.notify_all();
  }

  void on_gradient(size_t param, const at::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    const size_t b = bucket_of[param];
    if (b < sent) {
      if (misuse.empty()) {
        misuse = fmt::format(
            "GradientReducer: parameter {} got a gradient after its bucket was sent (a parameter used in two "
            "backward calls of one step, e.g. shared across reentrant checkpoints, cannot be reduced during backward)",
            param);
      }
      return;
    }
    at::Tensor& slot = buckets[b].slots[slot_of[param]];
    if (arrived[param]) {
      slot.add_(grad.reshape(-1));  // a second gradient before the bucket left: the sum
      return;
    }
    slot.copy_(grad.reshape(-1));
    arrived[param] = true;
    --waiting[b];
    send_ready_locked();
  }

  void run_worker() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      changed.wait(lock, [&] { return stopping || reduced < sent; });
      if (stopping) return;
      at::Tensor flat = buckets[reduced].flat;
      const bool failed = failure != nullptr;
      lock.unlock();
      std::exception_ptr error;
      if (!failed) {  // after a failure the group is out of step: the rest are skipped
        try {
          group.all_reduce_sum(flat);
        } catch (...) {
          error = std::current_exception();
        }
      }
      lock.lock();
      if (error) failure = error;
      ++reduced;
      changed.notify_all();
    }
  }

  std::thread worker;
};

GradientReducer::GradientReducer(std::vector<at::Tensor> params, const ProcessGroup& group,
                                 GradientReducerOptions options) {
  if (params.empty()) throw InvalidArgument("GradientReducer: no parameters");
  check_params(params);
  if (!(options.bucket_cap_mb() > 0)) {
    throw InvalidArgument(fmt::format("GradientReducer: bucket_cap_mb must be > 0, got {}", options.bucket_cap_mb()));
  }
  state_ = std::make_shared<State>(std::move(params), group.new_group(reducer_group_name(group)), options);
  State& s = *state_;
  s.buckets = make_buckets(s.params, static_cast<int64_t>(options.bucket_cap_mb() * 1024 * 1024));
  s.bucket_of.resize(s.params.size());
  s.slot_of.resize(s.params.size());
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    for (size_t k = 0; k < s.buckets[b].params.size(); ++k) {
      s.bucket_of[s.buckets[b].params[k]] = b;
      s.slot_of[s.buckets[b].params[k]] = k;
    }
  }
  s.arrived.resize(s.params.size());
  s.waiting.resize(s.buckets.size());
  s.reset_locked();
  s.worker = std::thread([&s] { s.run_worker(); });
  if (options.overlap()) {
    for (size_t i = 0; i < s.params.size(); ++i) {
      const std::weak_ptr<State> weak = state_;
      hook_handles_.push_back(s.params[i].register_hook([weak, i](const at::Tensor& grad) {
        if (const std::shared_ptr<State> state = weak.lock()) state->on_gradient(i, grad);
      }));
    }
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < hook_handles_.size(); ++i) state_->params[i].remove_hook(hook_handles_[i]);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    state_->changed.notify_all();
  }
  state_->worker.join();
}

void GradientReducer::synchronize() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mutex);
  // What the hooks did not bring: gradients outside the hooks (overlap off), or zeros.
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (s.arrived[i]) continue;
    const size_t b = s.bucket_of[i];  // not sent yet: a bucket is sent once complete
    at::Tensor& slot = s.buckets[b].slots[s.slot_of[i]];
    const at::Tensor& grad = s.params[i].grad();
    if (!s.options.overlap() && grad.defined()) {
      slot.copy_(grad.reshape(-1));
    } else {
      slot.zero_();
    }
    s.arrived[i] = true;
    --s.waiting[b];
  }
  s.send_ready_locked();
  s.changed.wait(lock, [&] { return s.reduced == s.buckets.size(); });
  const std::exception_ptr failure = s.failure;
  const std::string misuse = s.misuse;
  s.reset_locked();
  if (failure) std::rethrow_exception(failure);
  if (!misuse.empty()) throw InvalidArgument(misuse);
  lock.unlock();

  const at::NoGradGuard no_grad;
  const auto ranks = static_cast<double>(s.group.size());
  for (Bucket& bucket : s.buckets) {
    bucket.flat.div_(ranks);
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      at::Tensor param = s.params[bucket.params[k]];
      const at::Tensor mean = bucket.slots[k].view(param.sizes());
      if (param.grad().defined()) {
        param.mutable_grad().copy_(mean);
      } else {
        param.mutable_grad() = mean.clone();
      }
    }
  }
}

std::vector<std::vector<size_t>> GradientReducer::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : state_->buckets) out.push_back(bucket.params);
  return out;
}

}  // namespace stowage::dist
