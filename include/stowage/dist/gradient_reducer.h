#pragma once

// Gradient averaging for data parallelism, overlapped with the backward pass (the role of
// the Reducer inside PyTorch's DistributedDataParallel): the parameters are grouped into
// buckets of about bucket_cap_mb (25 MiB by default, as DDP's), in reverse order, since
// backward produces the last layers' gradients first. A gradient hook on each parameter
// copies its gradient into its bucket; once a bucket has all its gradients, a
// communication thread all-reduces it while backward goes on with the earlier layers.
//
//   dist::GradientReducer reducer(model->parameters(), group);
//   model->zero_grad(); loss.backward(); reducer.synchronize(); optimizer.step();
//
// The buckets are all-reduced in bucket order on every rank, whatever order their
// gradients arrive in, so the ranks' collectives always match. They run on a group of
// their own (made from `group` by the constructor, collectively), never interleaving with
// the caller's collectives.
//
// Contract: the gradients are zero or undefined before each backward (zero_grad()): the
// hooks see each backward's new gradient, and synchronize() replaces every parameter's
// gradient by the mean of those over the ranks; a parameter that got no gradient counts
// as zeros. A parameter whose hook fires again after its bucket was sent (used twice, in
// separate backward calls, as reentrant checkpointing of a shared parameter does) makes
// synchronize() throw InvalidArgument naming it, rather than average a partial gradient.
// A failed collective is rethrown by synchronize() (dist::CollectiveError); the group
// is then out of step for good, as any failed group.

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
  // bucket in synchronize(), after backward (to measure what the overlap gains).
  TORCH_ARG(bool, overlap) = true;
};

class GradientReducer {
 public:
  // `params`: the same list, in the same order, on every rank; one dtype on one device.
  // Throws InvalidArgument naming a parameter that is not a leaf requiring grad, or of
  // another dtype or device than the first.
  GradientReducer(std::vector<at::Tensor> params, const ProcessGroup& group, GradientReducerOptions options = {});
  // Removes the hooks and stops the communication thread, after the bucket in flight.
  ~GradientReducer();

  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // After each backward, on every rank: sends what the hooks have not sent yet, waits for
  // every bucket, and sets each parameter's gradient to its mean over the ranks.
  void synchronize();

  // The parameters of each bucket (indices into `params`), in the order they are sent.
  std::vector<std::vector<size_t>> buckets() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::vector<unsigned> hook_handles_;
};

}  // namespace stowage::dist
