// c10d's ProcessGroupGloo behind stowage::dist::ProcessGroup: its collectives, and how a
// group fails on every rank at once. Only collectives that LibTorch 1.13 and 2.x both
// have, with the same signatures, are used.
#include "dist/process_group_impl.h"

#include <stowage/error.h>

#include "util/exception_message.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#if defined(STOWAGE_WITH_CUDA)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL  // likewise for ProcessGroupNCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace stowage::dist {
namespace {

// The group's failure record in the store, under the group's prefix: a group fails at
// most once (afterwards every collective throws), so these keys are unique to the
// failed save or load.
constexpr const char* kFailureKey = "failure/cause";
constexpr const char* kCheckedInCountKey = "failure/checked_in";
constexpr const char* kDoneCountKey = "failure/done";  // survivors that have read the check-ins
std::string checked_in_key(int64_t rank) {
  return fmt::format("failure/rank_{}", rank);
}

std::vector<uint8_t> as_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// Waits for `work`, watching the store for a failure another rank posted. Returns the
// reason to give up ("" once the work is done, successfully or not).
template <typename WorkPtr>
std::string wait_watching_store(const ProcessGroup::Impl& group, const WorkPtr& work) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // Gloo fails the work itself at the timeout; this deadline only backs that up.
  const auto deadline = start + group.timeout + std::chrono::seconds(1);
  auto next_poll = start + kFailurePollInterval;
  // Short collectives finish within microseconds: sleep little at first. A sleep ends
  // at most 1 ms after the work: a rank that arrives a few ms before its peers would
  // otherwise oversleep them by as long again (with naps doubling up to 10 ms, each
  // all-gather of the memory tier's restore took 7 to 9 ms).
  auto nap = std::chrono::microseconds(20);
  while (!work->isCompleted()) {
    const auto now = Clock::now();
    if (now >= deadline) return fmt::format("no answer within the timeout of {} ms", group.timeout.count());
    if (now >= next_poll) {
      try {
        if (group.store->check({kFailureKey})) {
          const std::vector<uint8_t> cause = group.store->get(kFailureKey);
          return fmt::format("abandoned: {}", std::string(cause.begin(), cause.end()));
        }
        next_poll = now + kFailurePollInterval;
      } catch (const std::exception&) {
        // The store's host has gone (or finished: its last collective may complete
        // here still). Its connections tell the work, so it fails or completes alone.
        next_poll = deadline;
      }
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
  return {};
}

// Fails the group on every rank: posts `cause` (unless a rank did first), checks in and
// waits for the others, and throws CollectiveError naming those that never checked in.
[[noreturn]] void fail_group(ProcessGroup::Impl& group, const char* what, const std::string& cause) {
  const std::string where = fmt::format("process group '{}' (rank {} of {})", group.name, group.rank, group.size);
  std::vector<int64_t> missing;
  std::string outcome;
  try {
    if (!group.store->check({kFailureKey})) {
      group.store->set(kFailureKey, as_bytes(fmt::format("rank {}: {} failed: {}", group.rank, what, cause)));
    }
    group.store->set(checked_in_key(group.rank), std::vector<uint8_t>());
    group.store->add(kCheckedInCountKey, 1);
    const auto deadline = std::chrono::steady_clock::now() + group.check_in_timeout;
    while (group.store->add(kCheckedInCountKey, 0) < group.size && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int64_t r = 0; r < group.size; ++r) {
      if (!group.store->check({checked_in_key(r)})) missing.push_back(r);
    }
    // The store's host keeps it up until every survivor has read the check-ins (its
    // process may exit right after), those that checked in late included.
    group.store->add(kDoneCountKey, 1);
    if (group.rank == group.store_host) {
      const auto done_deadline = std::chrono::steady_clock::now() + group.check_in_timeout;
      while (group.store->add(kDoneCountKey, 0) < group.store->add(kCheckedInCountKey, 0) &&
             std::chrono::steady_clock::now() < done_deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (missing.empty()) {
      outcome = "every rank checked in";
    } else {
      outcome = fmt::format("rank(s) {} did not check in within {} ms: dead or unresponsive", fmt::join(missing, ", "),
                            group.check_in_timeout.count());
    }
  } catch (const std::exception& e) {
    // The store has gone, and with it the process that hosted it.
    if (group.store_host >= 0 && group.store_host != group.rank) missing.push_back(group.store_host);
    outcome = group.store_host >= 0 ? fmt::format("rank {}, which hosts the store, is dead or unreachable ({})",
                                                  group.store_host, exception_message(e))
                                    : fmt::format("the store is unreachable ({})", exception_message(e));
  }
  group.failure.emplace(
      fmt::format("{}: the group failed in an earlier collective ({} failed: {}; {}); make a new group", where, what,
                  cause, outcome),
      missing);
  throw CollectiveError(fmt::format("{}: {} failed: {}; {}", where, what, cause, outcome), std::move(missing));
}

// Runs one c10d collective and waits for it, within the group's timeout; fails the
// group if it fails here or on another rank.
template <typename Start>
void run(ProcessGroup::Impl& group, const char* what, Start&& start) {
  if (group.failure) throw *group.failure;
  std::string cause;
  try {
    auto work = start();
    cause = wait_watching_store(group, work);
    if (cause.empty()) {
      work->wait();  // rethrows the work's error
      return;
    }
  } catch (const std::exception& e) {
    cause = exception_message(e);
  }
  fail_group(group, what, cause);
}

at::Tensor bytes_tensor(const std::string& bytes, int64_t padded) {
  at::Tensor tensor = at::zeros({padded}, at::kByte);
  if (!bytes.empty()) std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

std::string tensor_bytes(const at::Tensor& tensor, int64_t length) {
  return std::string(static_cast<const char*>(tensor.data_ptr()), static_cast<size_t>(length));
}

void check_collective_tensor(const at::Tensor& tensor, const char* what) {
  if (!tensor.defined() || tensor.is_sparse() || !tensor.is_contiguous()) {
    throw InvalidArgument(fmt::format("ProcessGroup::{}: the tensor must be defined, dense and contiguous", what));
  }
}

}  // namespace

CollectiveError::CollectiveError(const std::string& message, std::vector<int64_t> unresponsive_ranks)
    : Error(message), unresponsive_ranks_(std::move(unresponsive_ranks)) {}

ProcessGroup::ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

int64_t ProcessGroup::rank() const {
  return impl_->rank;
}
int64_t ProcessGroup::size() const {
  return impl_->size;
}
std::chrono::milliseconds ProcessGroup::timeout() const {
  return impl_->timeout;
}

namespace {

// `group` once every rank has connected it: a rank that dropped a group the moment it was
// made (a GradientReducer made only to count its buckets) closed its connections under a
// peer still in Gloo's connectFullMesh, which then failed with "Connection closed by peer"
// (two ranks making and dropping 200 groups: 3 runs of 5 failed with both cores busy, none
// with this barrier).
ProcessGroup joined(ProcessGroup group) {
  group.barrier();
  return group;
}

}  // namespace

ProcessGroup ProcessGroup::new_group(const std::string& name) const {
  auto impl = std::make_shared<Impl>();
  impl->rank = impl_->rank;
  impl->size = impl_->size;
  impl->timeout = impl_->timeout;
  impl->check_in_timeout = impl_->check_in_timeout;
  impl->store_host = impl_->store_host;
  impl->name = impl_->name + "/" + name;
  impl->store = c10::make_intrusive<c10d::PrefixStore>(impl->name, impl_->store);
  try {
    impl->backend = make_gloo(impl->store, impl->rank, impl->size, impl->timeout);
  } catch (const std::exception& e) {
    throw Error(fmt::format("process group '{}' (rank {} of {}): cannot create: {}", impl->name, impl->rank, impl->size,
                            exception_message(e)));
  }
  return joined(ProcessGroup(std::move(impl)));
}

std::shared_ptr<void> ProcessGroup::attachment(const std::string& key,
                                               const std::function<std::shared_ptr<void>()>& make) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::shared_ptr<void>& attached = impl_->attachments[key];
  if (!attached) attached = make();
  return attached;
}

namespace {

// Every rank's length of its bytes, on every rank (`what`: the collective, for its
// errors). Gloo moves equal-sized tensors: the bytes follow padded to the longest.
std::vector<int64_t> all_gather_lengths(ProcessGroup::Impl& g, size_t length, const char* what) {
  std::vector<at::Tensor> length_in{at::full({1}, static_cast<int64_t>(length), at::kLong)};
  std::vector<std::vector<at::Tensor>> length_out(1);
  for (int64_t r = 0; r < g.size; ++r) length_out[0].push_back(at::empty({1}, at::kLong));
  c10d::AllgatherOptions options;
  options.timeout = g.timeout;
  run(g, what, [&] { return g.backend->allgather(length_out, length_in, options); });
  std::vector<int64_t> lengths;
  for (const at::Tensor& each : length_out[0]) lengths.push_back(each.item<int64_t>());
  return lengths;
}

// The padded length of `lengths`: the longest, and one at least (Gloo moves no empty tensor).
int64_t padded_length(const std::vector<int64_t>& lengths) {
  return std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
}

}  // namespace

std::vector<std::string> ProcessGroup::all_gather(const std::string& bytes) const {
  Impl& g = *impl_;
  const std::vector<int64_t> lengths = all_gather_lengths(g, bytes.size(), "all_gather (lengths)");
  const int64_t padded = padded_length(lengths);
  std::vector<at::Tensor> data_in{bytes_tensor(bytes, padded)};
  std::vector<std::vector<at::Tensor>> data_out(1);
  for (int64_t r = 0; r < g.size; ++r) data_out[0].push_back(at::empty({padded}, at::kByte));
  c10d::AllgatherOptions options;
  options.timeout = g.timeout;
  run(g, "all_gather", [&] { return g.backend->allgather(data_out, data_in, options); });
  std::vector<std::string> result;
  for (int64_t r = 0; r < g.size; ++r) result.push_back(tensor_bytes(data_out[0][r], lengths[r]));
  return result;
}

std::vector<std::string> ProcessGroup::gather(const std::string& bytes, int64_t root) const {
  Impl& g = *impl_;
  // Every rank needs the padded length, so the lengths go everywhere.
  const std::vector<int64_t> lengths = all_gather_lengths(g, bytes.size(), "gather (lengths)");
  const int64_t padded = padded_length(lengths);
  std::vector<at::Tensor> data_in{bytes_tensor(bytes, padded)};
  std::vector<std::vector<at::Tensor>> data_out;
  if (g.rank == root) {
    data_out.resize(1);
    for (int64_t r = 0; r < g.size; ++r) data_out[0].push_back(at::empty({padded}, at::kByte));
  }
  c10d::GatherOptions options;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "gather", [&] { return g.backend->gather(data_out, data_in, options); });
  std::vector<std::string> result;
  if (g.rank == root) {
    for (int64_t r = 0; r < g.size; ++r) {
      result.push_back(tensor_bytes(data_out[0][r], lengths[r]));
    }
  }
  return result;
}

std::string ProcessGroup::scatter(const std::vector<std::string>& parts, int64_t root) const {
  Impl& g = *impl_;
  if (g.rank == root && static_cast<int64_t>(parts.size()) != g.size) {
    throw InvalidArgument(fmt::format("ProcessGroup::scatter: {} parts for {} ranks", parts.size(), g.size));
  }
  // The lengths from the root, then the padded parts.
  std::vector<at::Tensor> lengths{at::zeros({g.size}, at::kLong)};
  if (g.rank == root) {
    for (int64_t r = 0; r < g.size; ++r) lengths[0][r] = static_cast<int64_t>(parts[r].size());
  }
  c10d::BroadcastOptions broadcast_options;
  broadcast_options.rootRank = root;
  broadcast_options.timeout = g.timeout;
  run(g, "scatter (lengths)", [&] { return g.backend->broadcast(lengths, broadcast_options); });
  const int64_t padded = std::max<int64_t>(1, lengths[0].max().item<int64_t>());
  std::vector<at::Tensor> data_out{at::empty({padded}, at::kByte)};
  std::vector<std::vector<at::Tensor>> data_in;
  if (g.rank == root) {
    data_in.resize(1);
    for (int64_t r = 0; r < g.size; ++r) data_in[0].push_back(bytes_tensor(parts[r], padded));
  }
  c10d::ScatterOptions options;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "scatter", [&] { return g.backend->scatter(data_out, data_in, options); });
  return tensor_bytes(data_out[0], lengths[0][g.rank].item<int64_t>());
}

std::string ProcessGroup::broadcast(const std::string& bytes, int64_t root) const {
  Impl& g = *impl_;
  std::vector<at::Tensor> length{at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "broadcast (length)", [&] { return g.backend->broadcast(length, options); });
  const int64_t size = length[0].item<int64_t>();
  std::vector<at::Tensor> data{bytes_tensor(g.rank == root ? bytes : std::string(), std::max<int64_t>(1, size))};
  run(g, "broadcast", [&] { return g.backend->broadcast(data, options); });
  return tensor_bytes(data[0], size);
}

namespace {

// Sends `out` to `to` while receiving `in` from `from`; the receive is posted first, so
// that every rank of a ring may send at once. Gloo's send and receive complete only in
// their wait() (isCompleted() stays false until then): each is waited on with the
// group's timeout, without watching the store as run() does.
void send_while_receiving(ProcessGroup::Impl& g, const char* what, std::vector<at::Tensor>& out, int64_t to,
                          std::vector<at::Tensor>& in, int64_t from) {
  constexpr int kShiftTag = 0;
  if (g.failure) throw *g.failure;
  std::string cause;
  try {
    // Gloo moves no empty tensor: an empty side is left out.
    c10::intrusive_ptr<c10d::Work> receive;
    c10::intrusive_ptr<c10d::Work> send;
    if (in[0].numel() > 0) receive = g.backend->recv(in, static_cast<int>(from), kShiftTag);
    if (out[0].numel() > 0) send = g.backend->send(out, static_cast<int>(to), kShiftTag);
    if (send) send->wait(g.timeout);
    if (receive) receive->wait(g.timeout);
    return;
  } catch (const std::exception& e) {
    cause = exception_message(e);
  }
  fail_group(g, what, cause);
}

// The checks of shift() and exchange() (`what`): InvalidArgument naming the culprit.
void check_point_to_point(const ProcessGroup::Impl& g, const char* what, int64_t to, int64_t from,
                          const std::vector<at::Tensor>& bytes) {
  if (to < 0 || to >= g.size || from < 0 || from >= g.size) {
    throw InvalidArgument(
        fmt::format("ProcessGroup::{}: to {} and from {} must be ranks of the group's {}", what, to, from, g.size));
  }
  for (const at::Tensor& each : bytes) {
    check_collective_tensor(each, what);
    if (each.scalar_type() != at::kByte || each.dim() != 1 || !each.device().is_cpu()) {
      throw InvalidArgument(fmt::format("ProcessGroup::{}: the bytes must be a 1-D uint8 CPU tensor, not {} {} on {}",
                                        what, each.dim(), c10::toString(each.scalar_type()), each.device().str()));
    }
  }
}

}  // namespace

at::Tensor ProcessGroup::shift(const at::Tensor& bytes, int64_t to, int64_t from) const {
  Impl& g = *impl_;
  check_point_to_point(g, "shift", to, from, {bytes});
  if (to == g.rank && from == g.rank) return bytes.clone();
  std::vector<at::Tensor> length_out{at::full({1}, bytes.numel(), at::kLong)};
  std::vector<at::Tensor> length_in{at::empty({1}, at::kLong)};
  send_while_receiving(g, "shift (lengths)", length_out, to, length_in, from);
  std::vector<at::Tensor> data_out{bytes};
  std::vector<at::Tensor> data_in{at::empty({length_in[0].item<int64_t>()}, at::kByte)};
  send_while_receiving(g, "shift", data_out, to, data_in, from);
  return data_in[0];
}

void ProcessGroup::exchange(const at::Tensor& out, int64_t to, const at::Tensor& in, int64_t from) const {
  Impl& g = *impl_;
  check_point_to_point(g, "exchange", to, from, {out, in});
  if (to == g.rank && from == g.rank) {
    in.copy_(out);
    return;
  }
  std::vector<at::Tensor> outs{out};
  std::vector<at::Tensor> ins{in};
  send_while_receiving(g, "exchange", outs, to, ins, from);
}

void ProcessGroup::barrier() const {
  Impl& g = *impl_;
  c10d::BarrierOptions options;
  options.timeout = g.timeout;
  run(g, "barrier", [&] { return g.backend->barrier(options); });
}

namespace {

[[noreturn]] void no_backend_for(c10::Device device) {
  throw InvalidArgument(
      fmt::format("ProcessGroup: no c10d backend for tensors on {} in this build (CPU tensors use "
                  "Gloo; CUDA tensors need a CUDA build, which uses NCCL; other accelerators go through host "
                  "copies over Gloo)",
                  device.str()));
}

// A device whose tensors have no c10d backend of their own but copy to and from the host:
// an accelerator other than CUDA (a PrivateUse1 device such as stowage's simulated one),
// or CUDA in a build without it. Their collectives run over Gloo on host copies, the
// path c10d itself offers such a device when it has no collective library.
bool collects_through_host(c10::Device device) {
#if defined(STOWAGE_WITH_CUDA)
  if (device.is_cuda()) return false;
#endif
  return !device.is_cpu() && device.type() != c10::kMeta && c10::impl::hasDeviceGuardImpl(device.type());
}

// The backend of a tensor collective on `device` (see the header).
CollectiveBackend& tensor_backend(ProcessGroup::Impl& g, c10::Device device) {
  if (device.is_cpu()) return *g.backend;
#if defined(STOWAGE_WITH_CUDA)
  if (device.is_cuda()) {
    if (!g.device_backend) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = g.timeout;
      auto store = c10::make_intrusive<c10d::PrefixStore>("nccl", g.store);
      g.device_backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(g.rank),
                                                                     static_cast<int>(g.size), options);
    }
    return *g.device_backend;
  }
#endif
  no_backend_for(device);
}

}  // namespace

std::string ProcessGroup::backend_name(c10::Device device) const {
  if (device.is_cpu()) return "gloo";
  if (collects_through_host(device)) return "gloo (host copies)";
#if defined(STOWAGE_WITH_CUDA)
  if (device.is_cuda()) return "nccl";
#endif
  no_backend_for(device);
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) const {
  Impl& g = *impl_;
  check_collective_tensor(tensor, "all_reduce_sum");
  if (collects_through_host(tensor.device())) {
    at::Tensor host = tensor.cpu();
    all_reduce_sum(host);
    tensor.copy_(host);
    return;
  }
  CollectiveBackend& backend = tensor_backend(g, tensor.device());
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = g.timeout;
  run(g, "all_reduce", [&] { return backend.allreduce(tensors, options); });
}

void ProcessGroup::reduce_sum(at::Tensor& tensor, int64_t root) const {
  Impl& g = *impl_;
  check_collective_tensor(tensor, "reduce_sum");
  if (root < 0 || root >= g.size) {
    throw InvalidArgument(
        fmt::format("ProcessGroup::reduce_sum: root {} is not a rank of this group of {}", root, g.size));
  }
  if (collects_through_host(tensor.device())) {
    at::Tensor host = tensor.cpu();
    reduce_sum(host, root);
    if (g.rank == root) tensor.copy_(host);
    return;
  }
  CollectiveBackend& backend = tensor_backend(g, tensor.device());
  std::vector<at::Tensor> tensors{tensor};
  c10d::ReduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "reduce", [&] { return backend.reduce(tensors, options); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, int64_t root) const {
  Impl& g = *impl_;
  check_collective_tensor(tensor, "broadcast");
  if (collects_through_host(tensor.device())) {
    at::Tensor host = tensor.cpu();
    broadcast(host, root);
    tensor.copy_(host);
    return;
  }
  CollectiveBackend& backend = tensor_backend(g, tensor.device());
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "broadcast", [&] { return backend.broadcast(tensors, options); });
}

void check_one_dtype_one_device(const std::vector<at::Tensor>& tensors, const std::string& who) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined()) throw InvalidArgument(fmt::format("{}: parameter {} is undefined", who, i));
    const at::Tensor& first = tensors.front();
    if (t.scalar_type() != first.scalar_type() || t.device() != first.device()) {
      throw InvalidArgument(fmt::format(
          "{}: parameter {} is {} on {}, parameter 0 {} on {}: every parameter must have one dtype on one device", who,
          i, c10::toString(t.scalar_type()), t.device().str(), c10::toString(first.scalar_type()),
          first.device().str()));
    }
  }
}

}  // namespace stowage::dist
