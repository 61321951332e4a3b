#include "optim/swap_pipeline.h"

#include <stowage/error.h>
#include <stowage/memory/skipped_sync.h>

#include "util/exception_message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

namespace stowage::optim::detail {

using memory::CopyEvent;
using memory::CopyLane;

Batches::Batches(const std::vector<int64_t>& sizes) : first_unit_(sizes.size() + 1, 0) {
  for (size_t b = 0; b < sizes.size(); ++b) first_unit_[b + 1] = first_unit_[b] + sizes[b];
}

int64_t Batches::batch_of(size_t u) const {
  return std::upper_bound(first_unit_.begin(), first_unit_.end(), u) - first_unit_.begin() - 1;
}

bool copies_succeeded(memory::CopyEngine& engine, const c10::optional<CopyEvent>& event) {
  if (!event) return false;
  try {
    engine.synchronize(*event);
    return true;
  } catch (...) {
    return false;
  }
}

namespace {

// One step's run of the pipeline, with what a failure needs to know.
class Pipeline {
 public:
  Pipeline(memory::CopyEngine& engine, SwapTransport& transport, std::vector<Unit>& units, const Batches& batches)
      : engine_(engine),
        transport_(transport),
        units_(units),
        batches_(batches),
        uploaded_(batches.count()),
        downloaded_(batches.count()) {}

  void run(CopyEvent& host_ready, const UnitUpdate& update) {
    const int64_t count = batches_.count();
    try {
      engine_.wait(CopyLane::kHostToDevice, host_ready);  // the previous step's downloads are in the host layout
      engine_.wait(CopyLane::kHostToDevice, engine_.record_compute());  // device memory the transport allocated
      upload(0);
      if (count > 1) upload(1);
      for (int64_t b = 0; b < count; ++b) {
        if (!memory::sync_skipped(memory::SkippedSync::kUploadWait)) engine_.wait_compute(uploaded_[b]);
        for (size_t u = batches_.begin(b); u < batches_.end(b); ++u) {
          update(units_[u], [&](const StateTensor& tensor) { return transport_.device_state(b, u, tensor); });
          processed_ = u + 1;
        }
        engine_.wait(CopyLane::kDeviceToHost, engine_.record_compute());
        transport_.download(b);
        downloaded_[b] = engine_.record(CopyLane::kDeviceToHost);
        const int64_t released = b - transport_.release_delay();
        if (released >= 0) {
          transport_.release(released, *downloaded_[released]);
          if (released + 2 < count) upload(released + 2);
        }
      }
      transport_.finish();
      host_ready = *downloaded_[count - 1];
      // The transport's device memory is released when the step returns, so the compute
      // side waits for the last download out of it. On a device with streams this is a
      // stream wait; on the CPU it blocks, and step() returns with every state on the host.
      engine_.wait_compute(host_ready);
    } catch (...) {
      // No copy or file I/O may still run on memory the transport frees on return.
      engine_.drain();
      transport_.abandon();
      host_ready = CopyEvent();
      recover(std::current_exception());
    }
  }

 private:
  void upload(int64_t b) {
    transport_.upload(b);
    uploaded_[b] = engine_.record(CopyLane::kHostToDevice);
  }

  bool downloaded(int64_t b) { return copies_succeeded(engine_, downloaded_[b]); }

  [[noreturn]] void recover(const std::exception_ptr& cause) {
    std::vector<int64_t> redone;
    std::vector<int64_t> kept;
    for (int64_t b = 0; b < batches_.count() && batches_.begin(b) < processed_; ++b) {
      const bool came_down = downloaded(b);
      if (came_down && transport_.stored(b)) continue;
      try {
        if (!came_down) {
          transport_.download(b);
          engine_.synchronize(engine_.record(CopyLane::kDeviceToHost));
        }
        transport_.store(b);
        redone.push_back(b);
      } catch (...) {
        engine_.drain();
        for (size_t u = batches_.begin(b); u < batches_.end(b); ++u) {
          for (const StateTensor& tensor : units_[u].state.tensors) {
            if (tensor.swapped) *tensor.holder = transport_.keep_on_device(b, u, tensor);
          }
        }
        kept.push_back(b);
      }
    }
    throw Error(fmt::format("Swap optimizer step failed: {} ({}; every state matches its parameter)", message_of(cause),
                            outcome(redone, kept)));
  }

  static std::string message_of(const std::exception_ptr& cause) {
    try {
      std::rethrow_exception(cause);
    } catch (const std::exception& e) {
      return exception_message(e);
    } catch (...) {
      return "an exception that is no std::exception";
    }
  }

  std::string outcome(const std::vector<int64_t>& redone, const std::vector<int64_t>& kept) const {
    std::string outcome;
    if (processed_ == units_.size()) {
      outcome = "every parameter was updated";
    } else {
      outcome = fmt::format("the update stopped in batch {} of {}: ", batches_.batch_of(processed_), batches_.count());
      outcome += processed_ == 0
                     ? std::string("no parameter was updated")
                     : fmt::format("parameters {} to {} were updated (those with a gradient), {} to {} were not",
                                   units_.front().index, units_[processed_ - 1].index, units_[processed_].index,
                                   units_.back().index);
    }
    if (!redone.empty()) {
      outcome += fmt::format("; the states of batch(es) {} were downloaded again", fmt::join(redone, ", "));
    }
    if (!kept.empty()) {
      outcome +=
          fmt::format("; the states of batch(es) {} could not be downloaded and stay on the device until the next step",
                      fmt::join(kept, ", "));
    }
    return outcome;
  }

  memory::CopyEngine& engine_;
  SwapTransport& transport_;
  std::vector<Unit>& units_;
  const Batches& batches_;
  std::vector<CopyEvent> uploaded_;
  std::vector<c10::optional<CopyEvent>> downloaded_;  // once enqueued
  size_t processed_ = 0;                              // the units before this one are updated
};

}  // namespace

void run_swap_pipeline(memory::CopyEngine& engine, SwapTransport& transport, std::vector<Unit>& units,
                       const Batches& batches, CopyEvent& host_ready, const UnitUpdate& update) {
  if (batches.count() == 0) return;
  Pipeline(engine, transport, units, batches).run(host_ready, update);
}

}  // namespace stowage::optim::detail
