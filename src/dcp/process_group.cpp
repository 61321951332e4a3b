// c10d's ProcessGroupGloo behind stowage::dcp::ProcessGroup. Only collectives that
// LibTorch 1.13 and 2.x both have, with the same signatures, are used.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // the c10d headers declare ProcessGroupGloo only under it
#endif

#include <stowage/dcp/process_group.h>
#include <stowage/error.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>

namespace stowage::dcp {

// What the collectives run on: ProcessGroupGloo's base class, which c10d renamed.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CollectiveBackend> backend;
  int64_t rank = 0;
  int64_t size = 1;
  std::chrono::milliseconds timeout{};
  std::string name;

  std::mutex mutex;  // guards the two below
  std::shared_ptr<Impl> async_save_group;
  std::shared_future<void> last_turn;  // completion of the save that took the last turn
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
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank), static_cast<int>(size),
                                                     options);
}

// Runs one c10d collective and waits for it, within the group's timeout.
template <typename Start>
void run(const ProcessGroup::Impl& group, const char* what, Start&& start) {
  try {
    auto work = start();
    work->wait(group.timeout);
  } catch (const std::exception& e) {
    throw Error(fmt::format("process group '{}' (rank {} of {}): {} failed, a rank has died or timed out after {} ms: {}",
                            group.name, group.rank, group.size, what, group.timeout.count(), e.what()));
  }
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
    throw InvalidArgument(fmt::format("init_process_group_from_env: environment variable {} is not set "
                                      "(run under torchrun or `stowage launch`)",
                                      name));
  }
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || parsed < 0) {
    throw InvalidArgument(
        fmt::format("init_process_group_from_env: environment variable {}='{}' is not a non-negative integer", name,
                    value));
  }
  return parsed;
}

}  // namespace

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

ProcessGroup ProcessGroup::new_group(const std::string& name) const {
  auto impl = std::make_shared<Impl>();
  impl->rank = impl_->rank;
  impl->size = impl_->size;
  impl->timeout = impl_->timeout;
  impl->name = impl_->name + "/" + name;
  impl->store = c10::make_intrusive<c10d::PrefixStore>(impl->name, impl_->store);
  try {
    impl->backend = make_gloo(impl->store, impl->rank, impl->size, impl->timeout);
  } catch (const std::exception& e) {
    throw Error(fmt::format("process group '{}' (rank {} of {}): cannot create: {}", impl->name, impl->rank,
                            impl->size, e.what()));
  }
  return ProcessGroup(std::move(impl));
}

ProcessGroup ProcessGroup::async_save_group() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->async_save_group) impl_->async_save_group = new_group("async_save").impl_;
  return ProcessGroup(impl_->async_save_group);
}

std::shared_future<void> ProcessGroup::take_turn(std::shared_future<void> done) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return std::exchange(impl_->last_turn, std::move(done));
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& bytes) const {
  const Impl& g = *impl_;
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
  const Impl& g = *impl_;
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
  const Impl& g = *impl_;
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
  const Impl& g = *impl_;
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
  const Impl& g = *impl_;
  c10d::BarrierOptions options;
  options.timeout = g.timeout;
  run(g, "barrier", [&] { return g.backend->barrier(options); });
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) const {
  const Impl& g = *impl_;
  check_collective_tensor(tensor, "all_reduce_sum");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = g.timeout;
  run(g, "all_reduce", [&] { return g.backend->allreduce(tensors, options); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, int64_t root) const {
  const Impl& g = *impl_;
  check_collective_tensor(tensor, "broadcast");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = g.timeout;
  run(g, "broadcast", [&] { return g.backend->broadcast(tensors, options); });
}

namespace {

ProcessGroup join_group(const std::string& master_addr, int master_port, int64_t rank, int64_t world_size,
                        bool host_store, const ProcessGroupOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument(fmt::format("init_process_group: rank {} is not within a world of size {}", rank,
                                      world_size));
  }
  if (master_port < 1 || master_port > std::numeric_limits<uint16_t>::max()) {
    throw InvalidArgument(fmt::format("init_process_group: MASTER_PORT {} is not a TCP port", master_port));
  }
  if (options.timeout().count() <= 0) {
    throw InvalidArgument(fmt::format("init_process_group: the timeout must be positive, got {} ms",
                                      options.timeout().count()));
  }
  auto impl = std::make_shared<ProcessGroup::Impl>();
  impl->rank = rank;
  impl->size = world_size;
  impl->timeout = options.timeout();
  impl->name = "stowage";
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(master_port);
    store_options.isServer = host_store && rank == 0;
    store_options.numWorkers = static_cast<size_t>(world_size);
    store_options.waitWorkers = true;
    store_options.timeout = options.timeout();
    auto tcp = c10::make_intrusive<c10d::TCPStore>(master_addr, store_options);
    impl->store = c10::make_intrusive<c10d::PrefixStore>(impl->name, tcp);
    impl->backend = make_gloo(impl->store, rank, world_size, impl->timeout);
  } catch (const std::exception& e) {
    throw Error(fmt::format("init_process_group: rank {} of {} cannot join the group at {}:{} within {} ms: {}", rank,
                            world_size, master_addr, master_port, options.timeout().count(), e.what()));
  }
  return ProcessGroup(std::move(impl));
}

}  // namespace

ProcessGroup init_process_group(const std::string& master_addr, int master_port, int64_t rank, int64_t world_size,
                                ProcessGroupOptions options) {
  return join_group(master_addr, master_port, rank, world_size, /*host_store=*/true, options);
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
  const bool host_store = agent_store == nullptr || std::string(agent_store) != "True";
  return join_group(addr, static_cast<int>(port), env_int("RANK"), env_int("WORLD_SIZE"), host_store, options);
}

}  // namespace stowage::dcp
