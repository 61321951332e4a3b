#include "dcp/storage/copy_ahead.h"

#include <stowage/memory/host_buffer.h>

#include <ATen/ATen.h>

namespace stowage::dcp::detail {
namespace {

bool needs_copy(const at::Tensor& tensor) {
  return !tensor.device().is_cpu();
}

}  // namespace

CopyAhead::CopyAhead(std::vector<at::Tensor> tensors, int64_t budget_bytes)
    : tensors_(std::move(tensors)), hosts_(tensors_.size()), copied_(tensors_.size()), budget_bytes_(budget_bytes) {}

memory::CopyEngine& CopyAhead::engine_for(c10::Device device) {
  for (auto& [engine_device, engine] : engines_) {
    if (engine_device == device) return *engine;
  }
  engines_.emplace_back(device, std::make_unique<memory::CopyEngine>(device));
  return *engines_.back().second;
}

void CopyAhead::start(size_t k) {
  const at::Tensor& tensor = tensors_[k];
  if (!needs_copy(tensor)) return;
  const at::Tensor source = tensor.resolve_conj().resolve_neg();
  memory::CopyEngine& engine = engine_for(source.device());
  memory::HostAllocOptions pinned;
  pinned.pin_memory = true;
  pinned.pin_for = source.device().type();
  pinned.use = memory::HostBufferUse::kCheckpoint;
  hosts_[k] = memory::allocate_host(source.sizes(), source.scalar_type(), pinned);
  // After whatever the current stream still has to do to the tensor.
  engine.wait(memory::CopyLane::kDeviceToHost, engine.record_compute());
  engine.copy(memory::CopyLane::kDeviceToHost, hosts_[k], source);
  copied_[k] = engine.record(memory::CopyLane::kDeviceToHost);
  ahead_bytes_ += static_cast<int64_t>(hosts_[k].nbytes());
}

at::Tensor CopyAhead::take(size_t k) {
  while (started_ <= k) start(started_++);
  at::Tensor tensor = std::move(tensors_[k]);
  at::Tensor host = std::move(hosts_[k]);
  if (host.defined()) ahead_bytes_ -= static_cast<int64_t>(host.nbytes());
  // Keep the copies after k going while item k is written.
  while (started_ < tensors_.size()) {
    const at::Tensor& next = tensors_[started_];
    if (needs_copy(next) && ahead_bytes_ + static_cast<int64_t>(next.nbytes()) > budget_bytes_) break;
    start(started_++);
  }
  if (!host.defined()) return tensor.resolve_conj().resolve_neg().contiguous();
  for (auto& [device, engine] : engines_) {
    if (device == tensor.device()) engine->synchronize(copied_[k]);
  }
  return host;
}

}  // namespace stowage::dcp::detail
