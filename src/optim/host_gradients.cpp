#include "optim/host_gradients.h"

#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <fmt/format.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace stowage::optim::detail {

at::Tensor pinned_host_like(const at::Tensor& like, c10::DeviceType device_type) {
  memory::HostAllocOptions options;
  options.pin_memory = true;  // where the device can pin; plain memory otherwise
  options.pin_for = device_type;
  options.use = memory::HostBufferUse::kOptimizer;
  return memory::allocate_host(like.sizes(), like.scalar_type(), options);
}

using memory::CopyEvent;
using memory::CopyLane;

namespace {

// A gradient the host update can take as it is: dense, shaped and typed as its parameter,
// on its device, and without a graph (create_graph). Any other stays on the device, where
// step()'s checks name it.
bool offloadable_gradient(const at::Tensor& param, const at::Tensor& grad) {
  return grad.defined() && grad.layout() == c10::kStrided && !grad.requires_grad() &&
         grad.scalar_type() == param.scalar_type() && grad.sizes() == param.sizes() && grad.device() == param.device();
}

}  // namespace

struct HostGradients::State {
  explicit State(memory::CopyEngine& copy_engine) : engine(copy_engine) {}

  struct Slot {
    at::Tensor param;
    at::Tensor host;      // the held gradient, once `ready` has completed and any pending add is done
    at::Tensor incoming;  // a later gradient, to be added to `host`
    bool held = false;
    bool pending_add = false;                            // `incoming` holds a gradient not yet added to `host`
    CopyEvent ready;                                     // after the last copy into `host` or `incoming`
    std::shared_ptr<torch::autograd::Node> accumulator;  // hooked; kept alive, as the parameter holds it weakly
    uintptr_t hook_key = 0;
  };

  // Completes the copies into a slot's buffers and adds a pending gradient, so that
  // `host` holds the sum and `incoming` is free.
  void settle(Slot& slot) {
    if (!slot.held) return;
    engine.synchronize(slot.ready);
    if (slot.pending_add) {
      slot.host.add_(slot.incoming);
      slot.pending_add = false;
    }
  }

  // Enqueues the copy of `grad` into the slot, as the held gradient or as one to add to it.
  // REQUIRES: the download lane waits for the compute that made `grad`.
  void enqueue_download(Slot& slot, const at::Tensor& grad) {
    settle(slot);
    at::Tensor& into = slot.held ? slot.incoming : slot.host;
    if (!into.defined()) into = pinned_host_like(slot.param, engine.device().type());
    engine.copy(CopyLane::kDeviceToHost, into, grad);
    slot.ready = engine.record(CopyLane::kDeviceToHost);
    slot.pending_add = slot.held;
    slot.held = true;
  }

  // The hook's work: the gradient autograd has just accumulated goes down and leaves the
  // device (its memory is reused once the copy has run: the lane records it).
  void offload(const c10::TensorImpl* key) {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = slots.find(key);
    if (found == slots.end()) return;
    Slot& slot = found->second;
    at::Tensor grad = slot.param.grad();
    if (!offloadable_gradient(slot.param, grad)) return;
    engine.wait(CopyLane::kDeviceToHost, engine.record_compute());
    enqueue_download(slot, grad);
    slot.param.mutable_grad().reset();
  }

  void unhook(Slot& slot) {
    if (slot.accumulator) slot.accumulator->del_post_hook(slot.hook_key);
    slot.accumulator.reset();
  }

  // Runs after autograd has accumulated a parameter's gradient into its .grad() (a tensor
  // hook would run before).
  class GradientAccumulated final : public torch::autograd::FunctionPostHook {
   public:
    GradientAccumulated(std::weak_ptr<State> state, const c10::TensorImpl* key) : state_(std::move(state)), key_(key) {}

    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list& /*inputs*/) override {
      if (const auto state = state_.lock()) state->offload(key_);
      return outputs;
    }

   private:
    std::weak_ptr<State> state_;
    const c10::TensorImpl* key_;
  };

  memory::CopyEngine& engine;
  mutable std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Slot> slots;
};

HostGradients::HostGradients(memory::CopyEngine& engine) : state_(std::make_shared<State>(engine)) {
  if (engine.device().is_cpu()) throw InvalidArgument("HostGradients: the engine is the CPU's, nothing to offload");
}

HostGradients::~HostGradients() {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& entry : state_->slots) state_->unhook(entry.second);
}

void HostGradients::watch(const std::vector<at::Tensor>& params) {
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::unordered_set<const c10::TensorImpl*> watched;
  for (const at::Tensor& param : params) {
    if (!param.is_leaf() || !param.requires_grad()) continue;  // autograd gives it no gradient
    const c10::TensorImpl* key = param.unsafeGetTensorImpl();
    watched.insert(key);
    State::Slot& slot = s.slots[key];
    if (slot.held) throw Error("HostGradients::watch: a gradient is still held");
    std::shared_ptr<torch::autograd::Node> now = torch::autograd::impl::grad_accumulator(param);
    if (now == slot.accumulator && slot.param.is_same(param)) continue;
    s.unhook(slot);
    slot.param = param;
    if (slot.host.defined() && (slot.host.sizes() != param.sizes() || slot.host.scalar_type() != param.scalar_type())) {
      slot.host = slot.incoming = at::Tensor();
    }
    slot.hook_key = now->add_post_hook(std::make_unique<State::GradientAccumulated>(state_, key));
    slot.accumulator = std::move(now);
  }
  for (auto it = s.slots.begin(); it != s.slots.end();) {
    if (watched.count(it->first) != 0) {
      ++it;
      continue;
    }
    if (it->second.held) throw Error("HostGradients::watch: a gradient is still held");
    s.unhook(it->second);
    it = s.slots.erase(it);
  }
}

bool HostGradients::holds(const at::Tensor& param) const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  const auto found = state_->slots.find(param.unsafeGetTensorImpl());
  return found != state_->slots.end() && found->second.held;
}

at::Tensor HostGradients::take(const at::Tensor& param) {
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  State::Slot& slot = s.slots.at(param.unsafeGetTensorImpl());
  s.settle(slot);
  return slot.host;
}

void HostGradients::restore_to_device(const at::Tensor& param) {
  State& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  const auto found = s.slots.find(param.unsafeGetTensorImpl());
  if (found == s.slots.end() || !found->second.held) return;
  State::Slot& slot = found->second;
  s.settle(slot);
  at::Tensor on_device = slot.host.to(param.device(), /*non_blocking=*/false, /*copy=*/true);
  if (param.grad().defined()) on_device.add_(param.grad());
  at::Tensor(param).mutable_grad() = on_device;
  slot.held = false;
}

void HostGradients::clear() {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& entry : state_->slots) {
    entry.second.held = false;
    entry.second.pending_add = false;
  }
}

}  // namespace stowage::optim::detail
