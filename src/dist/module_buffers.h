#pragma once

// The module buffers a GradientReducer keeps in step across the ranks (its broadcast_buffers
// option): rank 0's copied into every rank's, one broadcast per device, which carries that
// device's buffers side by side as bytes, whatever their dtypes. Private to the reducer.

#include <stowage/dist/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

// Not in an anonymous namespace: GradientReducer::State holds these types.
namespace stowage::dist::detail {

// What a parameter or buffer must keep for the reducer's place for it to fit it.
struct TensorShape {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  c10::Device device;

  explicit TensorShape(const at::Tensor& t);
  bool operator==(const TensorShape& other) const;
  std::string str() const;
};

// Throws InvalidArgument naming `tensor` ("<kind> <index>") when its shape, dtype or device
// is not `made` (what it was when the reducer was made) any more.
void check_shape_unchanged(const at::Tensor& tensor, const TensorShape& made, const char* kind, size_t index);

class ModuleBuffers {
 public:
  // Throws InvalidArgument naming an undefined buffer.
  explicit ModuleBuffers(std::vector<at::Tensor> buffers);

  // Throws InvalidArgument naming a buffer whose shape, dtype or device changed since.
  void check_unchanged() const;

  // Rank 0's buffers into every rank's of `group`. Collective. REQUIRES: no other
  // collective of `group` in flight, so that the group's collectives stay in order.
  void broadcast_from_rank0(const ProcessGroup& group);

 private:
  // The buffers of one device, their bytes side by side in `flat` there.
  struct DeviceGroup {
    std::vector<size_t> buffers;   // indices into buffers_
    std::vector<int64_t> offsets;  // by slot: where its buffer's bytes start in `flat`
    at::Tensor flat;
  };

  // The `slot`-th buffer of `group`'s place in its flat bytes, as the buffer's dtype and
  // shape (contiguous).
  at::Tensor slot(const DeviceGroup& group, size_t slot) const;

  std::vector<at::Tensor> buffers_;
  std::vector<TensorShape> shapes_;  // by buffer: when the reducer was made
  std::vector<DeviceGroup> groups_;  // in the order each device first appears
};

}  // namespace stowage::dist::detail
