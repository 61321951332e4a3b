#pragma once

// Gradient averaging for data parallelism, overlapped with the backward pass (the role of
// the Reducer inside PyTorch's DistributedDataParallel): the parameters are grouped into
// buckets of about bucket_cap_mb (25 MiB by default, as DDP's), in reverse order, since
// backward produces the last layers' gradients first. Once a bucket has all its
// gradients, a communication thread reduces it while backward goes on with the earlier
// layers.
//
//   dist::GradientReducer reducer(model->parameters(), model->buffers(), group);
//   reducer.zero_grad(); loss.backward(); reducer.synchronize(); optimizer.step();
//
// Gradients held once (DDP's gradient_as_bucket_view): the buckets are the gradients'
// storage. Each parameter's .grad() is a view of its slot in its bucket (strided as the
// parameter when it is dense), set by the constructor, so that autograd accumulates into
// the bucket in place and nothing is copied; the reducer learns of each gradient from a
// post-hook on the parameter's AccumulateGrad node (followed to a new node when set_data
// makes one, as a Module::to round trip does). zero_grad() zeroes the buckets in place and
// keeps the views; a .grad() reset or replaced by the caller (Module::zero_grad() resets
// on LibTorch 2.x), or a sparse gradient (Embedding with sparse=true), still gives the
// right result, at the cost of one copy into the bucket when its gradient arrives.
//
// Sharded gradients (ZeRO stage 2, with GradientReducerOptions::gradient_owners): each
// bucket holds the parameters of one owner and is reduced to that rank alone. A rank keeps
// the buckets of the parameters it owns, as above; the gradients of the others it copies
// into a bucket made when the first one arrives and freed once the bucket is reduced, so
// that between steps it holds only its own parameters' gradients; during backward it also
// holds the others' buckets from their first gradient until they are reduced (with
// overlap(false), until synchronize(): every bucket at once).
//
// The buckets are reduced in bucket order on every rank, whatever order their
// gradients arrive in, so the ranks' collectives always match. They run on a group of
// their own (made from `group` by the constructor, collectively), never interleaving with
// the caller's collectives.
//
// Contract: each backward's gradients are summed into zeroed gradients (zero_grad()
// before it) and synchronize() then leaves each parameter's gradient as the mean of those
// over the ranks (with gradient_owners: on its owner; the other ranks' .grad() of it is
// undefined); then, with buffers and options.broadcast_buffers(), it leaves every rank's
// buffers equal to rank 0's. A parameter that got no gradient counts as zeros. The parameters and
// buffers must keep the shape, dtype and device they had when the reducer was made
// (synchronize(), zero_grad() and broadcast_buffers() throw InvalidArgument naming one that changed, e.g. by
// Module::to); the reducer reduces the tensors it was given, so a model that registers new parameters needs a new
// reducer. A parameter whose gradient arrives again after its bucket was sent (used in two backward calls of one step,
// as reentrant checkpointing of a shared parameter does), or a backward with create_graph=true (the buckets are data,
// they keep no graph), makes synchronize() throw InvalidArgument on every rank, naming the parameter and the rank it
// happened on, rather than average a partial gradient: each synchronize() ends with a small all-reduce that lets every
// rank know. The gradients are then meaningless until zero_grad(). A failed collective is rethrown by synchronize()
// (dist::CollectiveError); the group is then out of step for good, as any failed group.
//
// Buffers (BatchNorm's running statistics): forward updates each rank's from its own
// batch, so they drift apart, and a save then stores one rank's for all (dcp::save
// refuses a replicated entry whose ranks hold different bytes). Given the module's
// buffers, the reducer makes every rank's rank 0's, as DDP's broadcast_buffers does, in
// one broadcast per device of all the buffers side by side (GradientReducerOptions::
// broadcast_buffers): in the constructor and at the end of each synchronize(). The next
// forward thus starts from rank 0's buffers, as under DDP (which broadcasts at the start
// of each forward), and between steps, when a checkpoint is saved, every rank holds the
// same buffers. The broadcast overwrites the buffers of ranks other than 0 in place.
//
// Thread safety: one thread calls the methods, never while a backward over the
// parameters runs (on whatever thread); the hooks run on the backward's threads.

#include <stowage/dist/process_group.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace stowage::dist {

struct GradientReducerOptions {
  // The size a bucket grows to (it holds one parameter at least), as DDP's bucket_cap_mb.
  TORCH_ARG(double, bucket_cap_mb) = 25;
  // Reduce each bucket as soon as its gradients are in, during backward; false: every
  // bucket in synchronize(), after backward (to measure what the overlap gains). Either
  // way the gradients are those backward accumulated, as the hooks saw them: a .grad() set
  // by hand, outside a backward, counts as no gradient (zeros).
  TORCH_ARG(bool, overlap) = true;
  // Empty: every rank gets every averaged gradient (an all-reduce per bucket). Otherwise
  // the rank that owns each parameter, by parameter: only the owner gets its averaged
  // gradient (a reduce per bucket; ZeRO stage 2), as ZeroRedundancyOptimizer::owners() gives.
  TORCH_ARG(std::vector<int64_t>, gradient_owners) = {};
  // True: each gradient is a view of its bucket (see above). False: the buckets are a
  // second copy of the gradients, copied in when each arrives and back after the
  // reduction (DDP's gradient_as_bucket_view=False, PyTorch's default; stowage's before
  // the views), for comparison.
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  // With buffers given: the constructor and each synchronize() copy rank 0's buffers into
  // every rank's (see above). False: the buffers stay each rank's own, unless the caller
  // calls broadcast_buffers() (DDP's broadcast_buffers=False).
  TORCH_ARG(bool, broadcast_buffers) = true;
};

class GradientReducer {
 public:
  // `params`: the same list, in the same order, on every rank; one dtype on one device.
  // Throws InvalidArgument naming a parameter that is not a leaf requiring grad, or of
  // another dtype or device than the first, or an owner that is not a rank of `group`.
  // A gradient a parameter already has is kept (copied into its bucket, with views).
  GradientReducer(std::vector<at::Tensor> params, const ProcessGroup& group, GradientReducerOptions options = {});
  // The same, and the module's buffers (e.g. model->buffers()), which the reducer keeps
  // equal to rank 0's (see above); with options.broadcast_buffers() it broadcasts them
  // once here. `buffers`: the same list, in the same order, on every rank, each of the
  // same shape and dtype on every rank; any dtypes and devices. Throws InvalidArgument
  // naming an undefined buffer.
  GradientReducer(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers, const ProcessGroup& group,
                  GradientReducerOptions options = {});
  // Removes the hooks and stops the communication thread, after the bucket in flight.
  // The gradients stay (views of the buckets, which they keep alive).
  ~GradientReducer();

  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Before each backward: zeroes the gradients this rank keeps, in place.
  void zero_grad();

  // After each backward, on every rank: sends what the hooks have not sent yet, waits for
  // every bucket, and leaves each gradient this rank keeps as its mean over the ranks;
  // then, with options.broadcast_buffers(), broadcasts the buffers (broadcast_buffers()).
  void synchronize();

  // Copies rank 0's buffers into every rank's now, whatever options.broadcast_buffers()
  // says (with it, synchronize() does this itself); nothing without buffers. Collective:
  // every rank calls it. Throws InvalidArgument naming a buffer whose shape, dtype or
  // device changed since the reducer was made.
  // REQUIRES: not between a backward and its synchronize() (the buckets' collectives run
  // on the same group); InvalidArgument otherwise.
  void broadcast_buffers();

  // The parameters of each bucket (indices into `params`), in the order they are sent.
  std::vector<std::vector<size_t>> buckets() const;
  // The bytes of the buckets this rank keeps from step to step: with
  // gradient_as_bucket_view the storage of the gradients it keeps, without a second copy.
  int64_t kept_bucket_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace stowage::dist
