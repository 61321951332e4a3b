#include "dist/module_buffers.h"

#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

namespace stowage::dist::detail {
namespace {

// Where each slot starts is a multiple of this, so that a slot can be viewed as any dtype.
constexpr int64_t kBufferAlignment = 16;

}  // namespace

TensorShape::TensorShape(const at::Tensor& t) : sizes(t.sizes().vec()), dtype(t.scalar_type()), device(t.device()) {}

bool TensorShape::operator==(const TensorShape& other) const {
  return sizes == other.sizes && dtype == other.dtype && device == other.device;
}

std::string TensorShape::str() const {
  return fmt::format("[{}] {} on {}", fmt::join(sizes, ", "), c10::toString(dtype), device.str());
}

void check_shape_unchanged(const at::Tensor& tensor, const TensorShape& made, const char* kind, size_t index) {
  const TensorShape now(tensor);
  if (!(now == made)) {
    throw InvalidArgument(
        fmt::format("GradientReducer: {} {} changed from {} to {} since the reducer was made; make a new reducer", kind,
                    index, made.str(), now.str()));
  }
}

ModuleBuffers::ModuleBuffers(std::vector<at::Tensor> buffers) : buffers_(std::move(buffers)) {
  std::vector<c10::Device> devices;
  std::vector<int64_t> bytes;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!buffers_[i].defined()) throw InvalidArgument(fmt::format("GradientReducer: buffer {} is undefined", i));
    shapes_.emplace_back(buffers_[i]);
    const auto device = std::find(devices.begin(), devices.end(), buffers_[i].device());
    const auto g = static_cast<size_t>(device - devices.begin());
    if (device == devices.end()) {
      devices.push_back(buffers_[i].device());
      groups_.emplace_back();
      bytes.push_back(0);
    }
    groups_[g].buffers.push_back(i);
    groups_[g].offsets.push_back(bytes[g]);
    const auto nbytes = static_cast<int64_t>(buffers_[i].nbytes());
    bytes[g] += (nbytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].flat = at::empty({bytes[g]}, at::TensorOptions().dtype(at::kByte).device(devices[g]));
  }
}

void ModuleBuffers::check_unchanged() const {
  for (size_t i = 0; i < buffers_.size(); ++i) check_shape_unchanged(buffers_[i], shapes_[i], "buffer", i);
}

at::Tensor ModuleBuffers::slot(const DeviceGroup& group, size_t slot) const {
  const at::Tensor& buffer = buffers_[group.buffers[slot]];
  return group.flat.narrow(0, group.offsets[slot], static_cast<int64_t>(buffer.nbytes()))
      .view(buffer.scalar_type())
      .view(buffer.sizes());
}

void ModuleBuffers::broadcast_from_rank0(const ProcessGroup& group) {
  const at::NoGradGuard no_grad;
  const bool root = group.rank() == 0;
  for (DeviceGroup& device_group : groups_) {
    if (device_group.flat.numel() == 0) continue;
    if (root) {
      for (size_t k = 0; k < device_group.buffers.size(); ++k)
        slot(device_group, k).copy_(buffers_[device_group.buffers[k]]);
    }
    group.broadcast(device_group.flat, 0);
    if (!root) {
      for (size_t k = 0; k < device_group.buffers.size(); ++k) {
        at::Tensor buffer = buffers_[device_group.buffers[k]];
        buffer.copy_(slot(device_group, k));
      }
    }
  }
}

}  // namespace stowage::dist::detail
