// Joining the first process group: rank 0's (or torchrun's agent's) TCPStore, and Gloo
// over it, from explicit values or from the environment torchrun and `stowage launch` set.
#include "dist/process_group_impl.h"

#include <stowage/dist/world.h>
#include <stowage/error.h>

#include "util/exception_message.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <limits>
#include <utility>

#include <signal.h>

namespace stowage::dist {

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

namespace {

// The launcher's variable `name`, which must be set.
int64_t required_launcher_count(const char* name) {
  try {
    if (const std::optional<int64_t> value = launcher_count(name)) return *value;
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("init_process_group_from_env: environment variable {}", e.what()));
  }
  throw InvalidArgument(
      fmt::format("init_process_group_from_env: environment variable {} is not set (run under torchrun or "
                  "`stowage launch`)",
                  name));
}

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
  const int64_t port = required_launcher_count("MASTER_PORT");
  if (port > std::numeric_limits<uint16_t>::max()) {
    throw InvalidArgument(fmt::format("init_process_group_from_env: MASTER_PORT={} is not a TCP port", port));
  }
  // torchrun's agent may host the store itself and say so; rank 0 then joins it.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_hosts_store = agent_store != nullptr && std::string(agent_store) == "True";
  const std::string attempt =
      agent_hosts_store ? std::to_string(required_launcher_count("TORCHELASTIC_RESTART_COUNT")) : "";
  return join_group(addr, static_cast<int>(port), required_launcher_count("RANK"),
                    required_launcher_count("WORLD_SIZE"), attempt, options);
}

}  // namespace stowage::dist
