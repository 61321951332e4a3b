#pragma once

// Activation checkpointing for LibTorch, the counterpart of torch.utils.checkpoint.
//
// checkpoint(fn, inputs) runs fn without recording its autograd graph, so none of the
// activations fn's operations would save for backward are kept. It keeps fn's tensor
// inputs (and the RNG state) instead; when backward reaches fn's outputs it reruns fn
// on those inputs with grad enabled and back-propagates through the recomputed graph.
// Outputs and gradients equal a plain run's bit for bit, as long as fn is
// deterministic given its inputs and the RNG state.
//
//   auto out = stowage::activation::checkpoint(
//       [&](const std::vector<c10::IValue>& in) -> std::vector<c10::IValue> {
//         return {block->forward(in[0].toTensor(), in[1].toDouble())};
//       },
//       {x, 0.5});
//   out[0].toTensor().sum().backward();
//
// What takes part in autograd:
//   - Top-level tensor inputs (is_tensor_like) are fn's differentiable inputs; their
//     gradients are returned by backward as for any operation. Every other input
//     (scalars, strings, None, lists...) is passed to fn unchanged, in forward and in
//     the recomputation. Tensors nested inside such containers are treated like fn's
//     parameters: fn uses them as they are, and gradients reach them (when they require
//     grad) as a side effect of the recomputation's backward.
//   - Top-level tensor outputs are differentiable outputs. Other outputs are returned
//     unchanged; an output container (list, tuple, dict) holding a tensor is rejected,
//     because fn ran without grad and that tensor could never carry a gradient.
//   - Parameters fn uses receive their gradients even when no input requires grad
//     (the reverse of PyTorch's long-standing #7617 behaviour): whenever grad mode is
//     on, fn's tensor outputs require grad. If the recomputation then finds that no
//     output depends on anything requiring grad, backward warns and returns no
//     gradients for this call.
//
// In-place modifications of the inputs:
//   - The recomputation reads fn's inputs again, so they must hold in backward what
//     they held in the forward. If fn modifies an input in place (a top-level tensor,
//     or one inside a container input), checkpoint raises RecomputationError naming the
//     input as soon as fn returns in the forward (the tensor then holds what a plain
//     call of fn leaves in it): the recomputation would modify it a second time and
//     compute the gradients at the modified value. Under no_grad nothing is recomputed
//     and nothing is checked. Modifying an input in place between the forward and
//     backward (e.g. by the caller) is a RecomputationError naming it when backward
//     starts the recomputation. Tensors fn reaches otherwise (the parameters and
//     buffers it captures) are not seen by checkpoint: they must not change between
//     the forward and backward either (e.g. no optimizer step in between).
//   - Buffers fn updates itself (a BatchNorm's running statistics and counter) would be
//     updated a second time by the recomputation, as PyTorch's checkpoint does; those
//     listed in CheckpointOptions::buffers end as after one plain forward instead.
//
// Restrictions of the reentrant variant (the only one provided, see use_reentrant):
//   - backward recomputes inside the engine's backward pass and calls backward again
//     (a "reentrant" backward). autograd::grad, and backward with its `inputs`
//     argument, restrict the engine to some graph nodes, which would skip the
//     parameters fn touches; such a call raises RecomputationError and leaves autograd
//     usable.
//   - Gradients of gradients: backward with create_graph through a checkpoint raises
//     RecomputationError (the recomputed gradients could not be differentiated towards
//     the caller's inputs).
//   - A second backward through the same outputs needs retain_graph, as for any graph;
//     it recomputes fn again.
//   - Autocast is not re-entered for the recomputation (LibTorch's C++ autocast
//     switches differ between 1.x and 2.x); run checkpointed code under autocast only
//     if fn sets it itself. A dtype difference this causes in fn's outputs is caught
//     by the determinism check.
//   - Only the RNG of devices that hold an input tensor is preserved: fn drawing random
//     numbers on another device is not replayed exactly (as in PyTorch).

#include <stowage/error.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <functional>
#include <vector>

namespace stowage::activation {

// A checkpoint could not be computed or replayed faithfully (the recomputation
// differed from the original forward, or the backward call is incompatible).
class RecomputationError : public Error {
 public:
  using Error::Error;
};
// Its name until dcp's error of the same name made two.
using CheckpointError [[deprecated("activation::CheckpointError is now activation::RecomputationError")]] =
    RecomputationError;

enum class DeterminismCheck {
  // PyTorch's "default": compares the number of outputs and each tensor output's
  // shape, dtype and device between the original forward and the recomputation; a
  // mismatch is a RecomputationError naming the output. (PyTorch's non-reentrant
  // variant compares the tensors saved for backward; what the reentrant variant can
  // compare is what fn returns.)
  Default,
  // PyTorch's "none": no comparison beyond what backward cannot do without (the
  // outputs' count and which of them are tensors must still match). Not named None,
  // which X11's headers define as a macro.
  Off,
};

struct CheckpointOptions {
  // Saves the CPU generator's state, and that of the default generator of every
  // other device an input tensor lives on, before fn runs, and replays fn from that
  // state in backward (then restores the state the generators had), so that random
  // operations such as dropout draw the same numbers twice. Devices no input lives
  // on are not touched (nor initialised).
  TORCH_ARG(bool, preserve_rng_state) = true;
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::Default;
  // true: the reentrant variant (a custom autograd function whose backward runs
  // fn and a nested backward). false would ask for PyTorch's non-reentrant variant,
  // built on saved-tensor hooks; LibTorch exposes no C++ way to install such hooks
  // short of replacing the process-wide autograd engine (Engine's
  // get_default_saved_variable_hooks through set_default_engine_stub, internal
  // headers, and impossible once the engine has run or inside Python), so stowage
  // rejects it with NotImplemented rather than ship something fragile.
  TORCH_ARG(bool, use_reentrant) = true;
  // Tensors fn updates in place as a side effect of its forward (a BatchNorm's running
  // statistics and counter). The recomputation in backward would update them again;
  // instead each is put back, once the recomputation's backward is done, to what it
  // held before the recomputation, so that they end as after one plain forward,
  // bit-identical to no checkpointing. checkpoint_sequential adds its modules' buffers.
  TORCH_ARG(std::vector<at::Tensor>, buffers) = {};
  // true: PyTorch's behaviour, the recomputation's updates stay (a BatchNorm's running
  // statistics take two momentum steps and its counter counts the batch twice); the
  // buffers are then left alone.
  TORCH_ARG(bool, keep_recomputed_buffer_updates) = false;
  // Keeps the tensor inputs the recomputation needs in host memory rather than on their
  // device between the forward and the backward (Hugging Face's and DeepSpeed's offload of
  // checkpoint inputs): once fn has run, each top-level tensor input on a device (the
  // first input's device, if they differ) is copied to pinned host memory on a side
  // stream, and its device memory is freed when the copy has run (if nothing else holds
  // it); backward brings it back before the recomputation. checkpoint_sequential brings
  // the previous segment's inputs back while the current one recomputes. Gradients are
  // bit-identical to keeping them. On the CPU it does nothing, and says so once; without
  // pinned memory for the device it copies to pageable memory, and says so once.
  TORCH_ARG(bool, offload_inputs) = false;
};

// fn receives the inputs (with tensors as given in forward, detached copies that
// require grad like the originals in the recomputation) and returns its outputs.
using CheckpointFunction = std::function<std::vector<c10::IValue>(const std::vector<c10::IValue>&)>;

std::vector<c10::IValue> checkpoint(const CheckpointFunction& fn, const std::vector<c10::IValue>& inputs,
                                    const CheckpointOptions& options = {});

// The common single-tensor case, e.g. one block of a model.
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

}  // namespace stowage::activation
