#include "sim/operators.h"

#include "sim/device_memory.h"
#include "sim/generator.h"
#include "sim/hazards.h"
#include "sim/pinned_memory.h"
#include "sim/runtime.h"
#include "sim/stream_queue.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_copy_from_and_resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace stowage::sim::detail {
namespace {

bool on_sim(const at::Tensor& tensor) {
  return tensor.defined() && tensor.device().type() == c10::DeviceType::PrivateUse1;
}

// A CPU tensor over the same bytes as `tensor` (sim memory is host memory), owning nothing,
// with its lazy conjugation and negation.
at::Tensor host_view(const at::Tensor& tensor) {
  at::Tensor view =
      at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(), tensor.options().device(c10::kCPU));
  if (tensor.is_conj()) view = view.conj();
  if (tensor.is_neg()) view = at::_neg_view(view);
  return view;
}

void raise_if_conflict(const at::Tensor& tensor, const c10::Stream& stream, Access access, const std::string& what) {
  Block* block = block_of(tensor);
  if (block == nullptr) return;
  const std::string conflict = find_conflict(block, stream, access, Rival::kUnfinished, what);
  if (!conflict.empty()) raise_hazard(conflict);
}

// The current stream of `device`, once the work queued on it has run: compute runs on the
// calling thread, after the stream's earlier work.
c10::Stream reach_current_stream(c10::DeviceIndex device) {
  const c10::Stream stream = current_stream(device);
  queue_of(stream).synchronize();
  return stream;
}

// ------------------------------------------------------------------ memory

void check_device_tensor_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "sim: only CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_device_tensor_options(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, &DeviceMemory::instance(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_device_tensor_options(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, &DeviceMemory::instance(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_device_tensor(const at::Tensor& self, c10::IntArrayRef size,
                                       std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());  // a larger storage comes from self's device
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

// Whether `from`'s data can replace `self`'s (Tensor::set_data, as Module::to does): dense
// tensors of the CPU and of the device can, as CPU and CUDA ones can.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) { return t.layout() == c10::kStrided && (t.is_cpu() || on_sim(t)); };
  return dense(self) && dense(from);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  DeviceMemory::instance().recordStream(self.storage().data_ptr(), stream);
}

// ------------------------------------------------------------------ copies

// A copy between device memory and pinned host memory asked to be non-blocking: queued
// on the device's current stream, it moves its bytes after a delay (and, while a CopyGate
// is closed, once something waits for it: StreamQueue::enqueue_copy). The host tensor is
// kept alive until then (as CUDA's pinned-memory allocator keeps its block); the device
// memory is not, so a free that was not ordered after the copy shows.
void queue_copy(const at::Tensor& host, const at::Tensor& on_device, bool upload) {
  const c10::Stream stream = current_stream(on_device.device().index());
  const Access access = upload ? Access::kWrite : Access::kRead;
  Block* block = block_of(on_device);
  copy_queued(block, stream, access);
  queue_of(stream).enqueue_copy([host, device_bytes = host_view(on_device), upload, block, stream, access,
                                 delay_us = draw_copy_delay_us()]() mutable {
    copy_running(block, stream, access);
    const std::string what = upload ? "a host-to-device copy" : "a device-to-host copy";
    std::string conflict = find_conflict(block, stream, access, Rival::kRunning, what);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    if (conflict.empty()) conflict = find_conflict(block, stream, access, Rival::kRunning, what);
    if (!conflict.empty()) defer_hazard(conflict);
    if (upload) {
      device_bytes.copy_(host);
    } else {
      host.copy_(device_bytes);
    }
    copy_finished(block, stream, access);
  });
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  throw_pending_hazard();
  if (self.numel() == 0) return dst;
  if (on_sim(self) && on_sim(dst)) {  // a kernel on the destination's current stream
    if (self.device() != dst.device()) reach_current_stream(self.device().index());
    const c10::Stream stream = reach_current_stream(dst.device().index());
    raise_if_conflict(self, stream, Access::kRead, "a device-to-device copy");
    raise_if_conflict(dst, stream, Access::kWrite, "a device-to-device copy");
    host_view(dst).copy_(host_view(self));
    return dst;
  }
  const bool upload = on_sim(dst);
  const at::Tensor& host = upload ? self : dst;
  const at::Tensor& on_device = upload ? dst : self;
  if (non_blocking && block_of(on_device) != nullptr && PinnedMemory::instance().contains(host.data_ptr())) {
    queue_copy(host, on_device, upload);
    return dst;
  }
  const c10::Stream stream = reach_current_stream(on_device.device().index());
  raise_if_conflict(on_device, stream, upload ? Access::kWrite : Access::kRead,
                    upload ? "a host-to-device copy" : "a device-to-host copy");
  if (upload) {
    host_view(dst).copy_(self);
  } else {
    dst.copy_(host_view(self));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_device_tensor(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, /*non_blocking=*/false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  throw_pending_hazard();
  const c10::Stream stream = reach_current_stream(self.device().index());
  raise_if_conflict(self, stream, Access::kRead, "item()");
  return at::native::_local_scalar_dense_cpu(host_view(self));
}

// ------------------------------------------------------------------ compute

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 1) return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  // Drawn on the device, from its generator, as CUDA's fused kernel draws from CUDA's.
  at::Tensor keep = at::empty_like(input).bernoulli_(1 - p);
  at::Tensor output = input.mul(keep).mul_(1 / (1 - p));
  return {output, keep.to(at::kBool)};
}

bool is_generator(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  const auto optional = type->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

template <typename Visit>
void for_each_sim_tensor(const c10::IValue& value, const Visit& visit) {
  if (value.isTensor()) {
    if (on_sim(value.toTensor())) visit(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor() && on_sim(element.toTensor())) visit(element.toTensor());
    }
  }
}

bool marked_written(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// Whether the op writes argument `index` of the `arguments` on the stack: marked so in its
// schema (Tensor(a!)), or written though unmarked. The unmarked writes of ATen's kernels
// (PyTorch's own list is torch::utils::SchemaInfo's "training ops"; the others there are
// composite or CUDA-only and never reach the simulator): batch norm's running statistics,
// which native_batch_norm updates in training and batch_norm_update_stats always.
bool writes_argument(const c10::FunctionSchema& schema, size_t index, c10::ArrayRef<c10::IValue> arguments) {
  const c10::Argument& argument = schema.arguments()[index];
  if (marked_written(argument)) return true;
  if (argument.name() != "running_mean" && argument.name() != "running_var") return false;
  if (schema.name() == "aten::batch_norm_update_stats") return true;
  if (schema.name() != "aten::native_batch_norm") return false;
  const std::optional<int> training = schema.argumentIndexWithName("training");
  return training.has_value() && arguments[*training].toBool();
}

// A CPU tensor to stand in for `tensor`: no bytes to share when it has none.
at::Tensor empty_host_tensor(const at::Tensor& tensor) {
  return at::empty_strided(tensor.sizes(), tensor.strides(), tensor.options().device(c10::kCPU));
}

// A device tensor over the bytes of `view`, a CPU tensor that shares the storage of
// host_view(device_tensor) (whose storage begins at device_tensor's first element): what
// the CPU kernel returned as a view of its argument is a view of the device tensor, as it
// would be on a device.
at::Tensor device_alias(const at::Tensor& device_tensor, const at::Tensor& view) {
  const int64_t byte_offset = device_tensor.storage_offset() * static_cast<int64_t>(device_tensor.itemsize()) +
                              view.storage_offset() * static_cast<int64_t>(view.itemsize());
  TORCH_INTERNAL_ASSERT(byte_offset % static_cast<int64_t>(view.itemsize()) == 0,
                        "sim: a returned view starts inside an element");
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(device_tensor.storage()), device_tensor.key_set(), view.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(),
                                                     byte_offset / static_cast<int64_t>(view.itemsize()));
  alias._set_conj(view.is_conj());
  alias._set_neg(view.is_neg());
  return alias;
}

// One op run by its CPU kernel on device memory. Each device tensor argument becomes a CPU
// view of its own bytes (sim memory is host memory), so that every write of the kernel
// lands on the device, whether the schema marks it or not (at::native::cpu_fallback ran
// the kernel on copies and copied back only the marked ones, losing, e.g., batch norm's
// running statistics). Arguments the schema marks written are the exception: the kernel
// may resize them (out= variants), which a view over fixed bytes cannot be, so they run on
// CPU copies that are copied back, resized, as cpu_fallback does.
class HostRun {
 public:
  HostRun(const c10::FunctionSchema& schema, torch::jit::Stack* stack) : schema_(schema), stack_(*stack) {}

  void run(const c10::OperatorHandle& op) {
    const size_t first = stack_.size() - schema_.arguments().size();
    for (size_t i = 0; i < schema_.arguments().size(); ++i) {
      replace_argument(stack_[first + i], marked_written(schema_.arguments()[i]));
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack_);
    for (const StandIn& stand_in : stand_ins_) {
      if (stand_in.written_copy) at::_copy_from_and_resize(stand_in.host, stand_in.device);
    }
    for (size_t i = stack_.size() - schema_.returns().size(); i < stack_.size(); ++i) replace_result(stack_[i]);
  }

 private:
  struct StandIn {
    at::Tensor device;
    at::Tensor host;
    bool written_copy;  // host is a copy the kernel writes, to be copied back
    bool shares_bytes;  // host is a view of device's bytes
  };

  void replace_argument(c10::IValue& value, bool written) {
    if (value.isTensor()) {
      if (on_sim(value.toTensor())) value = stand_in_for(value.toTensor(), written);
    } else if (value.isList()) {
      c10::List<c10::IValue> list = value.toList().copy();  // keeps the element type
      bool replaced = false;
      for (size_t j = 0; j < list.size(); ++j) {
        const c10::IValue element = list.get(j);
        if (element.isTensor() && on_sim(element.toTensor())) {
          list.set(j, stand_in_for(element.toTensor(), written));
          replaced = true;
        }
      }
      if (replaced) value = c10::IValue(std::move(list));
    } else if (value.isDevice()) {
      device_argument_ = value.toDevice();  // a factory's or a copy's: its results go there
      if (device_argument_->type() == c10::DeviceType::PrivateUse1) value = c10::IValue(c10::Device(c10::kCPU));
    }
  }

  at::Tensor stand_in_for(const at::Tensor& tensor, bool written) {
    if (!first_tensor_device_) first_tensor_device_ = tensor.device();
    const bool has_bytes = tensor.numel() > 0;
    at::Tensor host = !has_bytes ? empty_host_tensor(tensor) : written ? host_view(tensor).clone() : host_view(tensor);
    stand_ins_.push_back({tensor, host, written, has_bytes && !written});
    return host;
  }

  void replace_result(c10::IValue& value) {
    if (value.isTensor()) {
      value = to_device(value.toTensor());
    } else if (value.isList()) {
      const auto elements = value.toListRef();
      if (std::none_of(elements.begin(), elements.end(), [](const c10::IValue& e) { return e.isTensor(); })) return;
      c10::List<c10::IValue> list = value.toList().copy();
      for (size_t j = 0; j < list.size(); ++j) {
        const c10::IValue element = list.get(j);
        if (element.isTensor()) list.set(j, to_device(element.toTensor()));
      }
      value = c10::IValue(std::move(list));
    }
  }

  // The device tensor for a result: an argument returned (an in-place op's self) is the
  // device argument itself; a view of an argument's bytes is a view of the device
  // tensor; a new tensor is copied to the device.
  at::Tensor to_device(const at::Tensor& result) {
    if (!result.defined() || on_sim(result)) return result;
    for (const StandIn& stand_in : stand_ins_) {
      if (result.unsafeGetTensorImpl() == stand_in.host.unsafeGetTensorImpl()) return stand_in.device;
    }
    for (const StandIn& stand_in : stand_ins_) {
      if (stand_in.shares_bytes && result.storage().is_alias_of(stand_in.host.storage())) {
        return device_alias(stand_in.device, result);
      }
    }
    const std::optional<c10::Device> target = device_argument_ ? device_argument_ : first_tensor_device_;
    return target ? result.to(*target) : result;
  }

  const c10::FunctionSchema& schema_;
  torch::jit::Stack& stack_;
  std::vector<StandIn> stand_ins_;
  std::optional<c10::Device> device_argument_;
  std::optional<c10::Device> first_tensor_device_;
};

// Every op without a kernel of its own: run on the calling thread by its CPU kernel,
// after the work queued on the current stream of each device it touches, unless a queued
// copy on another stream still uses its tensors. Random ops draw from the device's
// generator.
void compute_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  throw_pending_hazard();
  const c10::FunctionSchema& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  const c10::ArrayRef<c10::IValue> values(stack->data() + first, arguments.size());
  c10::DeviceIndex device = -1;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const bool written = writes_argument(schema, i, values);
    for_each_sim_tensor(values[i], [&](const at::Tensor& tensor) {
      if (device < 0) device = tensor.device().index();
      const c10::Stream stream = reach_current_stream(tensor.device().index());
      raise_if_conflict(tensor, stream, written ? Access::kWrite : Access::kRead, schema.name());
    });
  }
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!is_generator(arguments[i])) continue;
    c10::IValue& value = (*stack)[first + i];
    const at::Generator generator =
        value.isGenerator() ? value.toGenerator() : default_generator(device < 0 ? current_device() : device);
    if (const auto* sim_generator = dynamic_cast<const SimGenerator*>(generator.unsafeGetGeneratorImpl())) {
      value = c10::IValue(sim_generator->cpu());
    }
  }
  HostRun(schema, stack).run(op);
}

}  // namespace

void register_operators() {
  // Made at run time, by register_device(), so that linking the library registers nothing.
  auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  aten->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  aten->impl("empty_strided", TORCH_FN(empty_strided));
  aten->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  aten->impl("resize_", TORCH_FN(resize_device_tensor));
  aten->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  aten->impl("view", TORCH_FN(at::native::view));
  aten->impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  aten->impl("set_.source_Storage", TORCH_FN(static_cast<at::Tensor& (*)(at::Tensor&, at::Storage)>(at::native::set_)));
  aten->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  aten->impl("record_stream", TORCH_FN(record_stream));
  aten->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  aten->impl("_copy_from", TORCH_FN(copy_from));
  aten->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  aten->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  aten->impl("native_dropout", TORCH_FN(native_dropout));
  auto* every_op = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  every_op->fallback(torch::CppFunction::makeFromBoxedFunction<&compute_fallback>());
  // A copy resolves lazy conjugation and negation itself (host_view keeps them for the CPU
  // copy): materializing them first would clone, which copies, which calls _copy_from again.
  for (const c10::DispatchKey key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    auto* lazy = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    lazy->impl("_copy_from", torch::CppFunction::makeFallthrough());
    lazy->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }
}

}  // namespace stowage::sim::detail
