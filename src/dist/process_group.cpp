// c10d's ProcessGroupGloo behind stowage::dist::ProcessGroup. Only collectives that
// LibTorch 1.13 and 2.x both have, with the same signatures, are used.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // the c10d headers declare ProcessGroupGloo only under it
#endif

#include <stowage/dist/process_group.h>
#include <stowage/error.h>

#include "util/exception_message.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

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
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <mutex>
#include <thread>
#include <utility>

#include <signal.h>

namespace stowage::dist {

// What the collectives run on: ProcessGroupGloo's base class, which c10d renamed.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CollectiveBackend> backend;         // Gloo
  c10::intrusive_ptr<CollectiveBackend> device_backend;  // NCCL, made on first use
  int64_t rank = 0;
  int64_t size = 1;
  std::chrono::milliseconds timeout{};
  std::chrono::milliseconds check_in_timeout{};
  std::string name;
  // The rank whose process hosts the TCPStore (-1: torchrun's agent does): when the
  // store is unreachable, that rank is gone.
  int64_t store_host = 0;

  // Set once a collective failed: the group is out of step for good. Only the thread
  // that runs the group's collectives touches it (they run one at a time).
  std::optional<CollectiveError> failure;

  std::mutex mutex;  // guards attachments
  std::map<std::string, std::shared_ptr<void>> attachments;
};

namespace {

c10::intrusive_ptr<CollectiveBackend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                int64_t size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // GLOO_SOCKET_IFNAME picks the interface as in PyTorch; otherwise the host name's
  // address (or the loopback interface when it has none).
  const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
  if (interface != nullptr && *interface != '\0') {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size), options);
}

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
  // Short collectives finish within microseconds: sleep little at first.
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
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(10));
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

int64_t env_int(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw InvalidArgument(
        fmt::format("init_process_group_from_env: environment variable {} is not set "
                    "(run under torchrun or `stowage launch`)",
                    name));
  }
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || parsed < 0) {
    throw InvalidArgument(fmt::format(
        "init_process_group_from_env: environment variable {}='{}' is not a non-negative integer", name, value));
  }
  return parsed;
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

std::vector<std::string> ProcessGroup::all_gather(const std::string& bytes) const {
  Impl& g = *impl_;
  // Gloo moves equal-sized tensors: exchange the lengths, then the padded bytes.
  std::vector<at::Tensor> length_in{at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong)};
  std::vector<std::vector<at::Tensor>> length_out(1);
  for (int64_t r = 0; r < g.size; ++r) length_out[0].push_back(at::empty({1}, at::kLong));
  c10d::AllgatherOptions options;
  options.timeout = g.timeout;
  run(g, "all_gather (lengths)", [&] { return g.backend->allgather(length_out, length_in, options); });
  int64_t padded = 1;
  for (const at::Tensor& length : length_out[0]) padded = std::max(padded, length.item<int64_t>());
  std::vector<at::Tensor> data_in{bytes_tensor(bytes, padded)};
  std::vector<std::vector<at::Tensor>> data_out(1);
  for (int64_t r = 0; r < g.size; ++r) data_out[0].push_back(at::empty({padded}, at::kByte));
  run(g, "all_gather", [&] { return g.backend->allgather(data_out, data_in, options); });
  std::vector<std::string> result;
  for (int64_t r = 0; r < g.size; ++r) result.push_back(tensor_bytes(data_out[0][r], length_out[0][r].item<int64_t>()));
  return result;
}

std::vector<std::string> ProcessGroup::gather(const std::string& bytes, int64_t root) const {
  Impl& g = *impl_;
  std::vector<at::Tensor> length_in{at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong)};
  std::vector<std::vector<at::Tensor>> length_out(1);
  for (int64_t r = 0; r < g.size; ++r) length_out[0].push_back(at::empty({1}, at::kLong));
  c10d::AllgatherOptions all_options;
  all_options.timeout = g.timeout;
  // Every rank needs the padded length, so the lengths go everywhere.
  run(g, "gather (lengths)", [&] { return g.backend->allgather(length_out, length_in, all_options); });
  int64_t padded = 1;
  for (const at::Tensor& length : length_out[0]) padded = std::max(padded, length.item<int64_t>());
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
      result.push_back(tensor_bytes(data_out[0][r], length_out[0][r].item<int64_t>()));
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

namespace {

// Gloo and the TCPStore write to their sockets without MSG_NOSIGNAL: once a peer has
// died, the next write raises SIGPIPE, whose default action kills this process before
// c10d can report the dead rank. Python ignores SIGPIPE at start-up and c10d relies on
// it; a C++ program must do the same, unless it has chosen its own disposition.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) == 0 &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// LibTorch 2.x's TCPStoreOptions::useLibUV defaults to true, and a LibTorch built without
// libuv (Debian's 2.6) then throws from every TCPStore. A save's few keys need no libuv:
// the classic backend is in every build. Options without the field (1.13) are left alone.
template <typename StoreOptions>
auto use_classic_store_backend(StoreOptions& options, int) -> decltype(options.useLibUV = false, void()) {
  options.useLibUV = false;
}
template <typename StoreOptions>
void use_classic_store_backend(StoreOptions&, long) {}

// `attempt`: torchrun's restart count when its agent hosts the store, else empty.
ProcessGroup join_group(const std::string& master_addr, int master_port, int64_t rank, int64_t world_size,
                        const std::string& attempt, const ProcessGroupOptions& options) {
  const bool host_store = attempt.empty();
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument(
        fmt::format("init_process_group: rank {} is not within a world of size {}", rank, world_size));
  }
  if (master_port < 1 || master_port > std::numeric_limits<uint16_t>::max()) {
    throw InvalidArgument(fmt::format("init_process_group: MASTER_PORT {} is not a TCP port", master_port));
  }
  if (options.timeout().count() <= 0 || options.check_in_timeout().count() <= 0) {
    throw InvalidArgument(
        fmt::format("init_process_group: the timeout and check_in_timeout must be positive, got {} "
                    "and {} ms",
                    options.timeout().count(), options.check_in_timeout().count()));
  }
  ignore_sigpipe_unless_handled();
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->rank = rank;
  impl->size = world_size;
  impl->timeout = options.timeout();
  impl->check_in_timeout = options.check_in_timeout();
  impl->store_host = host_store ? 0 : -1;
  impl->name = "stowage";
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(master_port);
    store_options.isServer = host_store && rank == 0;
    store_options.numWorkers = static_cast<size_t>(world_size);
    store_options.waitWorkers = true;
    store_options.timeout = options.timeout();
    use_classic_store_backend(store_options, 0);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(master_addr, store_options);
    const std::string prefix = host_store ? impl->name : fmt::format("/worker/attempt_{}/{}", attempt, impl->name);
    impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
    impl->backend = make_gloo(impl->store, rank, world_size, impl->timeout);
  } catch (const std::exception& e) {
    throw Error(fmt::format("init_process_group: rank {} of {} cannot join the group at {}:{} within {} ms: {}", rank,
                            world_size, master_addr, master_port, options.timeout().count(), exception_message(e)));
  }
  return ProcessGroup(std::move(impl));
}

}  // namespace

ProcessGroup init_process_group(const std::string& master_addr, int master_port, int64_t rank, int64_t world_size,
                                ProcessGroupOptions options) {
  return join_group(master_addr, master_port, rank, world_size, /*attempt=*/"", options);
}

ProcessGroup init_process_group_from_env(ProcessGroupOptions options) {
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    throw InvalidArgument(
        "init_process_group_from_env: environment variable MASTER_ADDR is not set (run under torchrun or "
        "`stowage launch`)");
  }
  const int64_t port = env_int("MASTER_PORT");
  if (port > std::numeric_limits<uint16_t>::max()) {
    throw InvalidArgument(fmt::format("init_process_group_from_env: MASTER_PORT={} is not a TCP port", port));
  }
  // torchrun's agent may host the store itself and say so; rank 0 then joins it.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_hosts_store = agent_store != nullptr && std::string(agent_store) == "True";
  const std::string attempt = agent_hosts_store ? std::to_string(env_int("TORCHELASTIC_RESTART_COUNT")) : "";
  return join_group(addr, static_cast<int>(port), env_int("RANK"), env_int("WORLD_SIZE"), attempt, options);
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
