#include "activation/offload.h"

#include <stowage/memory/host_buffer.h>
#include <stowage/memory/skipped_sync.h>

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <utility>

namespace stowage::activation {

using memory::CopyLane;

OffloadedInputs::OffloadedInputs(std::shared_ptr<memory::CopyEngine> engine, const std::vector<at::Tensor>& tensors)
    : engine_(std::move(engine)) {
  memory::HostAllocOptions host_options;
  host_options.pin_memory = true;
  host_options.pin_for = engine_->device().type();
  engine_->wait(CopyLane::kDeviceToHost, engine_->record_compute());
  for (const at::Tensor& tensor : tensors) {
    Offloaded item{memory::allocate_host(tensor.sizes(), tensor.scalar_type(), host_options),
                   tensor.sizes().vec(),
                   {},
                   tensor.requires_grad()};
    if (at::has_internal_overlap(tensor) == at::MemOverlap::No) item.strides = tensor.strides().vec();
    engine_->copy(CopyLane::kDeviceToHost, item.host, tensor);
    offloaded_.push_back(std::move(item));
  }
  on_host_ = engine_->record(CopyLane::kDeviceToHost);
}

void OffloadedInputs::prefetch() {
  if (!back_.empty() || offloaded_.empty()) return;
  engine_->wait(CopyLane::kHostToDevice, on_host_);
  const auto device_options = at::TensorOptions().device(engine_->device());
  for (const Offloaded& item : offloaded_) {
    at::Tensor on_device = item.strides.empty() ? at::empty(item.sizes, device_options.dtype(item.host.scalar_type()))
                                                : at::empty_strided(item.sizes, item.strides,
                                                                    device_options.dtype(item.host.scalar_type()));
    engine_->copy(CopyLane::kHostToDevice, on_device, item.host);
    back_.push_back(std::move(on_device));
  }
  on_device_ = engine_->record(CopyLane::kHostToDevice);
}

std::vector<at::Tensor> OffloadedInputs::take() {
  prefetch();
  if (!memory::sync_skipped(memory::SkippedSync::kOffloadWait)) engine_->wait_compute(on_device_);
  std::vector<at::Tensor> tensors = std::move(back_);
  back_.clear();
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].requires_grad_(offloaded_[i].requires_grad);
  return tensors;
}

}  // namespace stowage::activation
