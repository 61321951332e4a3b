#pragma once

// The host bytes of one writer thread's tensors, in the order it writes them, with the
// device-to-host copies started ahead of the writes
// (FileSystemWriterOptions::per_thread_copy_ahead).
//
// A tensor on a device is copied into host memory (pinned where the build can pin) on
// the device-to-host lane of a memory::CopyEngine for its device: a stream of its own
// where the device has streams, after the work already queued on the current stream.
// Invariant: when the thread takes item k, every copy up to k has started, and the
// copies started for items after k hold at most `budget_bytes` between them (the next
// copy starts only if it fits), so they run while the thread hashes and writes item k.
// A CPU tensor needs no copy and uses none of the budget: take() hands it back as it is
// (made contiguous). With a budget of 0 each device copy starts when its item is taken.

#include <stowage/memory/copy_engine.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace stowage::dcp::detail {

class CopyAhead {
 public:
  // The tensors in the order take() will ask for them. Each reference is dropped when
  // its item is taken.
  CopyAhead(std::vector<at::Tensor> tensors, int64_t budget_bytes);

  // Item k's bytes, contiguous on the CPU, lazy conjugation and negation resolved.
  // Items are taken once each, in order.
  at::Tensor take(size_t k);

 private:
  void start(size_t k);
  memory::CopyEngine& engine_for(c10::Device device);

  std::vector<at::Tensor> tensors_;
  std::vector<at::Tensor> hosts_;  // the host copies started and not taken yet
  std::vector<memory::CopyEvent> copied_;
  int64_t budget_bytes_;
  size_t started_ = 0;       // items below it have their copy started (or need none)
  int64_t ahead_bytes_ = 0;  // bytes of started copies of items not taken yet
  std::vector<std::pair<c10::Device, std::unique_ptr<memory::CopyEngine>>> engines_;
};

}  // namespace stowage::dcp::detail
