#include "optim/swap_pipeline.h"

#include <ATen/ATen.h>

namespace stowage::optim::detail {
namespace {

using memory::CopyEvent;
using memory::CopyLane;

// Batch b's device copies are allocated by upload(b) and freed by release(b), which the
// compute side does once their download has completed.
class PerTensorTransport final : public SwapTransport {
 public:
  PerTensorTransport(memory::CopyEngine& engine, const std::vector<Unit>& units, const Batches& batches,
                     c10::Device device)
      : engine_(engine), units_(units), batches_(batches), device_(device), staged_(batches.count()) {}

  void upload(int64_t b) override {
    auto& staged = staged_[b];
    staged.resize(batches_.end(b) - batches_.begin(b));
    for (size_t u = batches_.begin(b); u < batches_.end(b); ++u) {
      auto& tensors = staged[u - batches_.begin(b)];
      tensors.resize(kSlotCount);
      for (const StateTensor& tensor : units_[u].state.tensors) {
        if (tensor.swapped) {
          tensors[tensor.slot] = at::empty_like(*tensor.holder, tensor.holder->options().device(device_));
        }
      }
    }
    engine_.wait(CopyLane::kHostToDevice, engine_.record_compute());  // allocated on the compute side
    for_each_swapped(b, [&](const at::Tensor& device_copy, at::Tensor& host) {
      engine_.copy(CopyLane::kHostToDevice, device_copy, host);
    });
  }

  at::Tensor device_state(int64_t b, size_t u, const StateTensor& tensor) override {
    return staged_[b][u - batches_.begin(b)][tensor.slot];
  }

  void download(int64_t b) override {
    for_each_swapped(b, [&](const at::Tensor& device_copy, at::Tensor& host) {
      engine_.copy(CopyLane::kDeviceToHost, host, device_copy);
    });
  }

  void release(int64_t b, const CopyEvent& downloaded) override {
    engine_.wait_compute(downloaded);  // a stream wait, or on the CPU a block
    staged_[b].clear();
  }

  int64_t release_delay() const override { return 1; }

  at::Tensor keep_on_device(int64_t b, size_t u, const StateTensor& tensor) override {
    return device_state(b, u, tensor);
  }

 private:
  template <typename Visit>
  void for_each_swapped(int64_t b, Visit visit) {
    for (size_t u = batches_.begin(b); u < batches_.end(b); ++u) {
      for (const StateTensor& tensor : units_[u].state.tensors) {
        if (tensor.swapped) visit(staged_[b][u - batches_.begin(b)][tensor.slot], *tensor.holder);
      }
    }
  }

  memory::CopyEngine& engine_;
  const std::vector<Unit>& units_;
  const Batches& batches_;
  c10::Device device_;
  // staged_[b][u - batches_.begin(b)][slot]: the device copy of a swapped state.
  std::vector<std::vector<std::vector<at::Tensor>>> staged_;
};

}  // namespace

std::unique_ptr<SwapTransport> make_per_tensor_transport(memory::CopyEngine& engine, const std::vector<Unit>& units,
                                                         const Batches& batches, c10::Device device) {
  return std::make_unique<PerTensorTransport>(engine, units, batches, device);
}

}  // namespace stowage::optim::detail
