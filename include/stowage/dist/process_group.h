#pragma once

// A group of ranks on LibTorch's own c10d, for the checkpoint's collectives and the
// training loop's: a TCPStore rendezvous and a ProcessGroupGloo (its byte exchanges go
// over CPU tensors, so a checkpoint's collectives never touch the device or the training
// loop's streams), and NCCL for device tensors in a CUDA build. The c10d types stay in the .cpp: their class
// hierarchy differs between LibTorch 1.x (ProcessGroupGloo is a ProcessGroup) and 2.x
// (it is a Backend).
//
// Every collective is bounded by the group's timeout: a rank that dies makes the others
// fail as soon as its connections drop, and one that stops answering makes them fail
// after the timeout. All ranks must call the collectives in the same order.
//
// A failed collective fails the group on every rank: the rank that sees the failure
// posts it in the store, the ranks waiting in other collectives see it there within
// kFailurePollInterval and stop waiting, and every survivor checks in through the store
// and waits up to check_in_timeout for the others; the ranks that never check in are
// named in the CollectiveError as dead or unresponsive. From then on every collective
// on the group throws at once (make a new group). A collective abandoned this way stays
// queued in Gloo until its own timeout, which destroying the group waits for.

#include <stowage/error.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stowage::dist {

struct ProcessGroupOptions {
  // Bound on the rendezvous and on every collective. A save's collective waits for the
  // slowest rank's writes, so this must exceed the longest write; c10d's default.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // After a collective fails, how long the surviving ranks wait for each other to check
  // in before naming the missing ones dead or unresponsive. A rank busy outside the
  // collectives (a long write) checks in at its next collective, so a shorter wait may
  // name a slow rank along with a dead one.
  TORCH_ARG(std::chrono::milliseconds, check_in_timeout) = std::chrono::seconds(10);
};

// How often a rank waiting in a collective looks in the store for a failure another
// rank has posted.
constexpr std::chrono::milliseconds kFailurePollInterval{200};

// A collective that failed, on this rank or (posted in the store) on another.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& message, std::vector<int64_t> unresponsive_ranks);
  // The ranks that did not check in after the failure (dead, hung, or busy outside
  // the collectives for longer than check_in_timeout); empty when every rank did.
  const std::vector<int64_t>& unresponsive_ranks() const { return unresponsive_ranks_; }

 private:
  std::vector<int64_t> unresponsive_ranks_;
};

class ProcessGroup {
 public:
  struct Impl;
  explicit ProcessGroup(std::shared_ptr<Impl> impl);

  int64_t rank() const;
  int64_t size() const;
  std::chrono::milliseconds timeout() const;

  // A new group over the same ranks and store whose collectives never interleave with
  // this one's (its own Gloo context and connections, its keys under `name` in the
  // store). Collective: every rank calls it with the same name, and it returns once every
  // rank has connected (a rank may drop the group at once without failing its peers).
  ProcessGroup new_group(const std::string& name) const;

  // State that a layer above this one keeps per group (dcp's async_save keeps the group
  // its background saves run on, and their order), made by `make` on the first call with
  // `key` and the same object on later ones, destroyed with the group. Local: `make` runs
  // on the calling thread, and may itself call collectives (new_group), which every rank
  // then must reach in the same order.
  std::shared_ptr<void> attachment(const std::string& key, const std::function<std::shared_ptr<void>()>& make) const;

  // Byte exchanges, each a few c10d collectives on uint8 tensors. Throw
  // CollectiveError naming the operation, the cause and the ranks that did not check
  // in, on a timeout, a lost rank or a failure another rank posted.
  // Every rank's bytes, indexed by rank, on every rank.
  std::vector<std::string> all_gather(const std::string& bytes) const;
  // Every rank's bytes, indexed by rank, on `root`; empty elsewhere.
  std::vector<std::string> gather(const std::string& bytes, int64_t root) const;
  // parts[r] (given on `root` only) to rank r.
  std::string scatter(const std::vector<std::string>& parts, int64_t root) const;
  // root's bytes to every rank.
  std::string broadcast(const std::string& bytes, int64_t root) const;
  // A shift around a ring: every rank sends `bytes` (a 1-D uint8 tensor, of any length)
  // to rank `to` and returns those that rank `from` sent it, point to point (c10d send and
  // recv), so that each rank's bytes cross the network once. Every rank calls it, each
  // with its own `to` and `from`, which must pair up (this rank's `from` sends to it).
  // Throws InvalidArgument naming a `to` or `from` outside the group or bytes of another
  // shape or type.
  at::Tensor shift(const at::Tensor& bytes, int64_t to, int64_t from) const;
  // The same, point to point, into a tensor of the length the caller knows already
  // (shift() sends the lengths first): sends `out` to rank `to` while receiving into `in`
  // from rank `from`; an empty side moves nothing. Only the ranks that move bytes call it.
  // REQUIRES: `from` calls it with an `out` as long as this rank's `in`, and `to` with an
  // `in` as long as this rank's `out`.
  // Throws InvalidArgument as shift() does.
  void exchange(const at::Tensor& out, int64_t to, const at::Tensor& in, int64_t from) const;
  void barrier() const;

  // Tensor collectives, in place, for a training loop that shares the group (data
  // parallelism): dense contiguous tensors. CPU tensors go through the group's Gloo
  // backend; CUDA tensors, in a CUDA build, through c10d's NCCL backend, made on the first
  // such collective over the same store (every rank must then pass CUDA tensors: the
  // choice is by device); tensors of another accelerator (e.g. stowage/sim/sim.h's) through
  // Gloo on host copies, copied back. The byte exchanges above stay on Gloo over CPU tensors, so a
  // checkpoint never touches the device's streams. Throw Error as above.
  // Sums `tensor` over the ranks.
  void all_reduce_sum(at::Tensor& tensor) const;
  // Sums `tensor` over the ranks into root's; the other ranks' tensors are left undefined
  // in content (c10d may use them as scratch). Throws InvalidArgument for a root that is
  // not a rank of the group.
  void reduce_sum(at::Tensor& tensor, int64_t root) const;
  // root's `tensor` into every rank's, which must have its dtype and size.
  void broadcast(at::Tensor& tensor, int64_t root) const;
  // The c10d backend the tensor collectives use for tensors on `device`: "gloo", "nccl" or
  // "gloo (host copies)". Throws InvalidArgument for a device this build has no backend for.
  std::string backend_name(c10::Device device) const;

 private:
  std::shared_ptr<Impl> impl_;
};

// Tensors moved by one collective as one flat buffer must all be defined and share
// tensors[0]'s dtype and device. Throws InvalidArgument otherwise, naming `who`, the
// first tensor that differs ("<who>: parameter 2 is Double on cpu, parameter 0 Float on
// cpu: every parameter must have one dtype on one device").
void check_one_dtype_one_device(const std::vector<at::Tensor>& tensors, const std::string& who);

// Joins the group the environment describes, as torchrun and `stowage launch` set it:
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME, if set, picks the
// network interface as in PyTorch. Rank 0 hosts the TCPStore, unless torchrun's agent
// does (TORCHELASTIC_USE_AGENT_STORE=True; the group's keys then live under the
// restart's attempt, TORCHELASTIC_RESTART_COUNT, as in PyTorch, so that a restarted job
// never reads its predecessor's). Throws InvalidArgument naming a
// missing or malformed variable, and Error if the rendezvous fails within the timeout.
// Joining sets SIGPIPE to ignored when it has its default action (as Python does at
// start-up): c10d writes to the sockets of peers that may have died, and must get EPIPE,
// not a killed process, to report them.
ProcessGroup init_process_group_from_env(ProcessGroupOptions options = {});

// The same with explicit values.
ProcessGroup init_process_group(const std::string& master_addr, int master_port, int64_t rank, int64_t world_size,
                                ProcessGroupOptions options = {});

}  // namespace stowage::dist
