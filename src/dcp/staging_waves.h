#pragma once

// Staging within a host budget (AsyncSaveOptions::staging_budget_bytes): the state's
// tensor entries, in order, packed into waves of at most the budget; each wave is copied
// into one host buffer, written, and the buffer reused by the next wave. The writes go
// through the save's own writer, one write_data per wave, so checksums, the plan and the
// commit rule (metadata last) are those of any save.

#include <stowage/dcp/planner.h>
#include <stowage/dcp/saveable_state.h>
#include <stowage/dcp/storage.h>

#include <ATen/core/ivalue.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace stowage::dcp::detail {

class StagingWaves {
 public:
  // Packs the tensor entries of `source` into waves of at most `budget_bytes`. Throws
  // InvalidArgument naming an entry larger than the budget, and the smallest budget that
  // fits (the largest entry).
  StagingWaves(const FlatStateDict& source, int64_t budget_bytes);

  size_t count() const { return waves_.size(); }

  // Called once the last wave is staged (before it is written): from then on the
  // source may change. Set before write().
  void set_on_staged(std::function<void()> on_staged) { on_staged_ = std::move(on_staged); }

  // Stages and writes `plan`'s tensor items wave by wave. `data` holds the leaves of the
  // source the waves were made from (by index); a wave's entries are replaced by their
  // staged copies, written and dropped. Each wave's files are named after it
  // ("<file_prefix>-w<N>"), so that no wave's files replace another's.
  // REQUIRES: the entries not staged yet do not change until on_staged.
  std::vector<WriteResult> write(StorageWriter& writer, const SavePlan& plan, std::vector<c10::IValue>& data);

 private:
  void stage_wave(const std::vector<size_t>& wave, const at::Tensor& buffer, std::vector<c10::IValue>& data) const;

  std::vector<std::vector<size_t>> waves_;  // indices of the source's leaves
  int64_t buffer_bytes_ = 0;                // the largest wave's
  // Page-locked for the device of the first tensor not on the CPU, where it can pin.
  bool pin_ = false;
  c10::DeviceType pin_for_ = c10::DeviceType::CPU;
  std::function<void()> on_staged_;
};

}  // namespace stowage::dcp::detail
