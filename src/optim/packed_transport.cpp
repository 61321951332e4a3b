#include <stowage/error.h>

#include "optim/swap_pipeline.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>

namespace stowage::optim::detail {
namespace {

using memory::CopyEvent;
using memory::CopyLane;

// Batch b's states of one dtype fill host elements [start, end) of that dtype's buffer
// and the same number of elements from arena_offset(dtype) in arena b % 2. The upload of
// b + 2 into that arena waits for the download of b, so a failed download leaves the
// arena with the batch's updated states for recovery (the upload lane fails on waiting).
class PackedTransport final : public SwapTransport {
 public:
  PackedTransport(memory::CopyEngine& engine, const std::vector<Unit>& units, const Batches& batches,
                  const std::map<c10::ScalarType, at::Tensor>& host_buffers, c10::Device device)
      : engine_(engine), host_buffers_(host_buffers), ranges_(batches.count()) {
    for (int64_t b = 0; b < batches.count(); ++b) {
      for (size_t u = batches.begin(b); u < batches.end(b); ++u) add_to_range(b, units[u]);
    }
    const int64_t arena_bytes = lay_out_arenas();
    const int arena_count = batches.count() > 1 ? 2 : 1;
    for (int a = 0; a < arena_count && arena_bytes > 0; ++a) {
      arenas_.push_back(at::empty({arena_bytes}, at::TensorOptions().dtype(at::kByte).device(device)));
    }
    arena_free_.resize(arena_count);
  }

  void upload(int64_t b) override {
    engine_.wait(CopyLane::kHostToDevice, arena_free_[b % 2]);
    for (const auto& [dtype, range] : ranges_[b]) {
      engine_.copy(CopyLane::kHostToDevice, arena_view(b, dtype), host_range(b, dtype));
    }
  }

  at::Tensor device_state(int64_t b, size_t, const StateTensor& tensor) override {
    const c10::ScalarType dtype = tensor.holder->scalar_type();
    return arena_view(b, dtype)
        .narrow(0, host_offset(tensor) - ranges_[b].at(dtype).start, tensor.holder->numel())
        .view(tensor.holder->sizes());
  }

  void download(int64_t b) override {
    for (const auto& [dtype, range] : ranges_[b]) {
      engine_.copy(CopyLane::kDeviceToHost, host_range(b, dtype), arena_view(b, dtype));
    }
  }

  void release(int64_t b, const CopyEvent& downloaded) override { arena_free_[b % 2] = downloaded; }

  int64_t release_delay() const override { return 0; }

  at::Tensor keep_on_device(int64_t b, size_t u, const StateTensor& tensor) override {
    return device_state(b, u, tensor).clone();
  }

 private:
  struct Range {
    int64_t start = 0;
    int64_t end = 0;  // elements, exclusive
  };

  void add_to_range(int64_t b, const Unit& unit) {
    for (const StateTensor& tensor : unit.state.tensors) {
      if (!tensor.swapped) continue;
      const c10::ScalarType dtype = tensor.holder->scalar_type();
      const int64_t element = tensor.holder->element_size();
      auto [it, first] = ranges_[b].try_emplace(dtype, Range{host_offset(tensor), host_offset(tensor)});
      if (!first && host_offset(tensor) != align_up(it->second.end, kAlignmentBytes / element)) {
        throw Error(
            fmt::format("Packed optimizer batch {} has a non-contiguous {} host range at state '{}' of "
                        "parameter {}.",
                        b, c10::toString(dtype), slot_name(tensor.slot), unit.index));
      }
      it->second.end = host_offset(tensor) + tensor.holder->numel();
    }
  }

  // Dtypes by name, each range aligned and as large as the largest batch's range of that
  // dtype. Returns the arena's size in bytes.
  int64_t lay_out_arenas() {
    std::map<std::string, c10::ScalarType> dtypes_by_name;
    for (const auto& batch : ranges_) {
      for (const auto& [dtype, range] : batch) dtypes_by_name[c10::toString(dtype)] = dtype;
    }
    int64_t arena_bytes = 0;
    for (const auto& [name, dtype] : dtypes_by_name) {
      int64_t largest = 0;
      for (const auto& batch : ranges_) {
        if (const auto it = batch.find(dtype); it != batch.end()) {
          largest = std::max(largest, (it->second.end - it->second.start) * int64_t(c10::elementSize(dtype)));
        }
      }
      arena_offset_[dtype] = align_up(arena_bytes, kAlignmentBytes);
      arena_bytes = arena_offset_[dtype] + largest;
    }
    return arena_bytes;
  }

  at::Tensor arena_view(int64_t b, c10::ScalarType dtype) const {
    const Range& range = ranges_[b].at(dtype);
    const int64_t bytes = (range.end - range.start) * int64_t(c10::elementSize(dtype));
    return arenas_[b % 2].narrow(0, arena_offset_.at(dtype), bytes).view(dtype);
  }

  at::Tensor host_range(int64_t b, c10::ScalarType dtype) const {
    const Range& range = ranges_[b].at(dtype);
    return host_buffers_.at(dtype).narrow(0, range.start, range.end - range.start);
  }

  memory::CopyEngine& engine_;
  const std::map<c10::ScalarType, at::Tensor>& host_buffers_;
  std::vector<std::map<c10::ScalarType, Range>> ranges_;  // per batch
  std::map<c10::ScalarType, int64_t> arena_offset_;       // bytes
  std::vector<at::Tensor> arenas_;
  std::vector<CopyEvent> arena_free_;  // per arena: the last download out of it
};

}  // namespace

std::unique_ptr<SwapTransport> make_packed_transport(memory::CopyEngine& engine, const std::vector<Unit>& units,
                                                     const Batches& batches,
                                                     const std::map<c10::ScalarType, at::Tensor>& host_buffers,
                                                     c10::Device device) {
  return std::make_unique<PackedTransport>(engine, units, batches, host_buffers, device);
}

}  // namespace stowage::optim::detail
