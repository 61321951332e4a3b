#include <stowage/activation/checkpoint.h>
#include <stowage/activation/tensor_like.h>
#include <stowage/memory/host_buffer.h>

#include "activation/input_versions.h"
#include "activation/nested_tensors.h"
#include "activation/offload.h"
#include "activation/rng_state.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace stowage::activation {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct TensorMeta {
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;

  explicit TensorMeta(const at::Tensor& tensor)
      : sizes(tensor.sizes().vec()), dtype(tensor.scalar_type()), device(tensor.device()) {}
  bool operator==(const TensorMeta& other) const {
    return sizes == other.sizes && dtype == other.dtype && device == other.device;
  }
  std::string str() const {
    return fmt::format("shape [{}], dtype {}, device {}", fmt::join(sizes, ", "), c10::toString(dtype), device.str());
  }
};

bool holds_tensor(const c10::IValue& value) {
  bool found = false;
  for_each_tensor(value, [&found](const at::Tensor&) { found = true; });
  return found;
}

// Everything backward needs besides the saved input tensors. Lives in the autograd
// node (through ctx->saved_data), so it is freed with the graph.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFunction fn;
  CheckpointOptions options;
  // fn's inputs with the tensor slots emptied: the tensors are saved in ctx, which
  // frees them after backward (unless retain_graph) and detects a second backward.
  std::vector<c10::IValue> inputs;
  std::vector<size_t> tensor_input_slots;
  std::optional<RngSnapshot> rng;
  // Recorded before fn first runs, when autograd records the call (a recomputation
  // will follow); empty under no_grad, where modifying an input is harmless.
  std::optional<InputVersions> versions;
  // With offload_inputs: the tensor inputs (by their position among the tensors) whose
  // host copies `offloaded` holds instead of ctx, and the offloaded inputs of the
  // checkpoint before this one in its chain, which backward prefetches.
  std::vector<size_t> offloaded_slots;
  std::shared_ptr<OffloadedInputs> offloaded;
  std::shared_ptr<OffloadedInputs> earlier;
  OffloadChain* chain = nullptr;  // during the forward only
  // What the original forward produced: the number of outputs, which of them are
  // tensors, and their metadata, for the determinism check.
  size_t num_outputs = 0;
  std::vector<size_t> tensor_output_slots;
  std::vector<TensorMeta> tensor_output_meta;
};

// The buffers fn updates in place (CheckpointOptions::buffers) as they were before
// the recomputation, to put back once its backward is done: then no graph that saved
// them is left to find them changed.
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const CheckpointOptions& options) {
    if (options.keep_recomputed_buffer_updates()) return;
    const at::NoGradGuard no_grad;
    for (const at::Tensor& buffer : options.buffers()) {
      if (buffer.defined()) saved_.emplace_back(buffer, buffer.clone());
    }
  }

  void restore() {
    const at::NoGradGuard no_grad;
    for (auto& [buffer, before] : saved_) buffer.copy_(before);
    saved_.clear();
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;
};

// The tensors the recomputation starts from: saved in ctx as they are, or, with
// offload_inputs, those on a device copied to host memory (ctx saves an undefined tensor
// in their place). The inputs on other devices than the first one's stay where they are.
void keep_inputs(AutogradContext* ctx, CheckpointState& state, at::TensorList tensors) {
  std::vector<at::Tensor> kept = tensors.vec();
  // `versions` is recorded exactly when autograd records the call: only then will a
  // backward need the inputs.
  if (state.options.offload_inputs() && state.versions) {
    std::vector<at::Tensor> to_offload;
    for (size_t i = 0; i < kept.size(); ++i) {
      if (kept[i].is_cpu() || (!to_offload.empty() && kept[i].device() != to_offload.front().device())) continue;
      to_offload.push_back(kept[i]);
      state.offloaded_slots.push_back(i);
      kept[i] = at::Tensor();
    }
    if (to_offload.empty()) {
      TORCH_WARN_ONCE(
          "checkpoint: offload_inputs does nothing for inputs on the CPU, which are in host memory already");
    } else {
      const c10::Device device = to_offload.front().device();
      if (!memory::can_pin_memory(device.type())) {
        TORCH_WARN_ONCE("checkpoint: offload_inputs without pinned host memory for ", device.str(),
                        ": the inputs are copied to pageable memory, which the copies wait for");
      }
      OffloadChain* chain = state.chain;
      std::shared_ptr<memory::CopyEngine> engine =
          chain != nullptr && chain->engine && chain->engine->device() == device
              ? chain->engine
              : std::make_shared<memory::CopyEngine>(device);
      state.offloaded = std::make_shared<OffloadedInputs>(engine, to_offload);
      if (chain != nullptr) {
        chain->engine = engine;
        state.earlier = std::exchange(chain->last, state.offloaded);
      }
    }
  }
  ctx->save_for_backward(kept);
}

// Splits fn's outputs into the differentiable tensors and the rest, rejecting a
// container that hides a tensor from autograd.
variable_list tensor_outputs(const std::vector<c10::IValue>& outputs, std::vector<size_t>& slots) {
  variable_list tensors;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (is_tensor_like(outputs[i])) {
      slots.push_back(i);
      tensors.push_back(outputs[i].toTensor());
    } else if (holds_tensor(outputs[i])) {
      throw InvalidArgument(fmt::format(
          "checkpoint: output {} of fn is a {} holding tensors; only top-level tensor outputs carry gradients "
          "through a checkpoint, so return those tensors as separate outputs",
          i, outputs[i].tagKind()));
    }
  }
  return tensors;
}

void check_recomputation(const CheckpointState& state, const std::vector<c10::IValue>& outputs,
                         const std::vector<size_t>& slots, const variable_list& tensors) {
  if (outputs.size() != state.num_outputs || slots != state.tensor_output_slots) {
    throw RecomputationError(fmt::format(
        "checkpoint: the recomputation of fn in backward returned {} outputs with tensors at positions [{}], but "
        "the original forward returned {} outputs with tensors at positions [{}]; fn must return the same kinds "
        "of outputs when run again on the same inputs",
        outputs.size(), fmt::join(slots, ", "), state.num_outputs, fmt::join(state.tensor_output_slots, ", ")));
  }
  if (state.options.determinism_check() == DeterminismCheck::Off) {
    return;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta recomputed(tensors[i]);
    if (!(recomputed == state.tensor_output_meta[i])) {
      throw RecomputationError(fmt::format(
          "checkpoint: the recomputation of fn in backward gave output {} {}, but the original forward gave {}; "
          "fn is not deterministic in its output metadata (pass "
          "CheckpointOptions().determinism_check(DeterminismCheck::Off) to skip this check)",
          slots[i], recomputed.str(), state.tensor_output_meta[i].str()));
    }
  }
}

// The reentrant checkpoint as a custom autograd function. Its graph inputs are fn's
// top-level input tensors plus `anchor`, a leaf that always requires grad: without it
// a call whose inputs don't require grad would not be recorded at all (apply only
// records a node when some input requires grad), its outputs would not require grad,
// and the parameters inside fn would silently get no gradient (PyTorch #7617). The
// anchor's own gradient is always undefined, so nothing accumulates into it.
struct CheckpointNode : torch::autograd::Function<CheckpointNode> {
  static variable_list forward(AutogradContext* ctx, const c10::intrusive_ptr<CheckpointState>& state,
                               at::TensorList tensors, const at::Tensor& /*anchor*/,
                               std::vector<c10::IValue>* outputs) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);

    std::vector<c10::IValue> inputs = state->inputs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      inputs[state->tensor_input_slots[i]] = tensors[i];
    }
    if (state->options.preserve_rng_state()) {
      state->rng = RngSnapshot::capture(inputs);
    }
    *outputs = state->fn(inputs);
    if (state->versions) {
      state->versions->expect_unchanged(InputVersions::Moment::kAfterForward);
    }
    keep_inputs(ctx, *state, tensors);
    variable_list result = tensor_outputs(*outputs, state->tensor_output_slots);
    state->num_outputs = outputs->size();
    for (const at::Tensor& tensor : result) {
      state->tensor_output_meta.emplace_back(tensor);
    }
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The recomputation's backward below must reach the parameters inside fn; a
    // backward restricted to some inputs (autograd::grad, backward's `inputs`) would
    // skip them. The engine reports that restriction here.
    if (!torch::autograd::Engine::get_default_engine().is_checkpoint_valid()) {
      throw RecomputationError(
          "checkpoint (reentrant) cannot run under torch::autograd::grad() or a backward() given its `inputs` "
          "argument: the recomputation must back-propagate into every parameter fn uses. Call backward() on the "
          "loss without `inputs` and read the gradients from .grad()");
    }
    // The engine runs backward with grad mode on exactly when create_graph was asked
    // for. The recomputation's gradients would be differentiable only towards the
    // detached input copies, not the caller's inputs: refuse rather than return
    // gradients whose own gradients are silently wrong.
    if (at::GradMode::is_enabled()) {
      throw RecomputationError(
          "checkpoint (reentrant) cannot compute gradients of gradients: backward was called with "
          "create_graph=true through a checkpoint; run that part of the model without checkpoint");
    }
    const auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    // Before get_saved_variables, whose own version check would raise a c10::Error that
    // does not say which input it is.
    if (state->versions) {
      state->versions->expect_unchanged(InputVersions::Moment::kBeforeRecomputation);
    }
    variable_list saved = ctx->get_saved_variables();
    if (state->offloaded) {
      const std::vector<at::Tensor> back = state->offloaded->take();
      for (size_t i = 0; i < back.size(); ++i) saved[state->offloaded_slots[i]] = back[i];
      // The inputs of the checkpoint before this one come back while this one recomputes.
      if (state->earlier) state->earlier->prefetch();
    }
    // One gradient per argument of forward: state, each tensor, anchor, outputs. Only
    // the tensors' can be defined.
    const size_t num_grads = saved.size() + 3;

    if (std::none_of(grad_outputs.begin(), grad_outputs.end(), [](const at::Tensor& g) { return g.defined(); })) {
      return variable_list(num_grads);
    }

    std::vector<c10::IValue> inputs = state->inputs;
    variable_list detached;
    for (size_t i = 0; i < saved.size(); ++i) {
      detached.push_back(saved[i].detach().requires_grad_(saved[i].requires_grad()));
      inputs[state->tensor_input_slots[i]] = detached.back();
    }

    BufferSnapshot buffers(state->options);
    variable_list grads;
    try {
      grads = recompute_and_backward(*state, inputs, detached, grad_outputs, num_grads);
    } catch (...) {
      buffers.restore();
      throw;
    }
    buffers.restore();
    return grads;
  }

  // Runs fn again on `inputs` (holding the `detached` copies of the saved tensors) and
  // back-propagates `grad_outputs` through it; returns the gradients of forward's
  // arguments.
  static variable_list recompute_and_backward(const CheckpointState& state, const std::vector<c10::IValue>& inputs,
                                              const variable_list& detached, const variable_list& grad_outputs,
                                              size_t num_grads) {
    std::vector<c10::IValue> outputs;
    {
      std::optional<RngReplay> replay;
      if (state.rng) {
        replay.emplace(*state.rng);
      }
      at::AutoGradMode enable_grad(true);
      outputs = state.fn(inputs);
    }
    if (state.versions) {
      state.versions->expect_unchanged(InputVersions::Moment::kAfterRecomputation);
    }
    std::vector<size_t> slots;
    const variable_list recomputed = tensor_outputs(outputs, slots);
    check_recomputation(state, outputs, slots, recomputed);

    variable_list roots;
    variable_list root_grads;
    for (size_t i = 0; i < recomputed.size(); ++i) {
      if (recomputed[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(recomputed[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    if (roots.empty()) {
      TORCH_WARN(
          "checkpoint: no output of fn that received a gradient requires grad in the recomputation (neither an "
          "input nor a parameter fn uses requires grad), so this checkpoint passes no gradient back and is not "
          "necessary");
      return variable_list(num_grads);
    }
    torch::autograd::backward(roots, root_grads);

    variable_list grads(num_grads);
    for (size_t i = 0; i < detached.size(); ++i) {
      grads[i + 1] = detached[i].grad();
    }
    return grads;
  }
};

}  // namespace

std::vector<c10::IValue> checkpoint(const CheckpointFunction& fn, const std::vector<c10::IValue>& inputs,
                                    const CheckpointOptions& options) {
  return checkpoint_in_chain(fn, inputs, options, nullptr);
}

std::vector<c10::IValue> checkpoint_in_chain(const CheckpointFunction& fn, const std::vector<c10::IValue>& inputs,
                                             const CheckpointOptions& options, OffloadChain* chain) {
  if (!options.use_reentrant()) {
    throw NotImplemented(
        "checkpoint: CheckpointOptions().use_reentrant(false) is not available: the non-reentrant variant needs "
        "saved-tensor hooks, which LibTorch only exposes to Python (see stowage/activation/checkpoint.h); use the "
        "reentrant variant");
  }
  if (!fn) {
    throw InvalidArgument("checkpoint: fn is empty");
  }
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  state->inputs = inputs;
  state->chain = chain;
  variable_list tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (is_tensor_like(inputs[i])) {
      state->tensor_input_slots.push_back(i);
      tensors.push_back(inputs[i].toTensor());
      state->inputs[i] = c10::IValue();
    }
  }
  if (at::GradMode::is_enabled()) {  // the anchor makes autograd record the call
    state->versions.emplace(inputs);
  }
  const at::Tensor anchor = at::empty({0}).requires_grad_(true);
  std::vector<c10::IValue> outputs;
  const variable_list differentiable = CheckpointNode::apply(state, at::TensorList(tensors), anchor, &outputs);
  state->chain = nullptr;
  for (size_t i = 0; i < differentiable.size(); ++i) {
    outputs[state->tensor_output_slots[i]] = differentiable[i];
  }
  return outputs;
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  if (!fn) {
    throw InvalidArgument("checkpoint: fn is empty");
  }
  if (!input.defined()) {
    throw InvalidArgument("checkpoint: the input tensor is undefined");
  }
  const std::vector<c10::IValue> outputs = checkpoint(
      [fn](const std::vector<c10::IValue>& in) -> std::vector<c10::IValue> { return {fn(in[0].toTensor())}; }, {input},
      options);
  return outputs[0].toTensor();
}

}  // namespace stowage::activation
