#include "dcp/staging_waves.h"

#include <stowage/byte_count.h>
#include <stowage/dcp/staging.h>
#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <utility>

namespace stowage::dcp {
namespace {

bool is_staged_tensor(const c10::IValue& value) {
  return value.isTensor() && value.toTensor().defined();
}

// The bytes a tensor takes staged: its elements, contiguous, at an arena's alignment.
int64_t staged_bytes(const at::Tensor& tensor) {
  const int64_t bytes = static_cast<int64_t>(tensor.numel()) * static_cast<int64_t>(tensor.element_size());
  return (bytes + memory::kHostArenaAlignment - 1) / memory::kHostArenaAlignment * memory::kHostArenaAlignment;
}

StagingFootprint footprint_of(const FlatStateDict& leaves) {
  StagingFootprint footprint;
  for (const FlatEntry& entry : leaves.entries()) {
    if (!is_staged_tensor(entry.value)) continue;
    const int64_t bytes = staged_bytes(entry.value.toTensor());
    ++footprint.entries;
    footprint.total_bytes += bytes;
    if (bytes > footprint.largest_entry_bytes) {
      footprint.largest_entry_bytes = bytes;
      footprint.largest_entry = entry.fqn;
    }
  }
  return footprint;
}

}  // namespace

StagingFootprint staging_footprint(const SaveableState& state) {
  return footprint_of(state.leaves());
}

namespace detail {

StagingWaves::StagingWaves(const FlatStateDict& source, int64_t budget_bytes) {
  const StagingFootprint footprint = footprint_of(source);
  if (footprint.largest_entry_bytes > budget_bytes) {
    throw InvalidArgument(fmt::format(
        "a staging budget of {} is smaller than the entry '{}' ({}), which is staged whole: the smallest staging "
        "budget that fits this state is {}",
        bytes_exactly(budget_bytes), footprint.largest_entry, bytes_exactly(footprint.largest_entry_bytes),
        bytes_exactly(footprint.largest_entry_bytes)));
  }
  int64_t wave_bytes = 0;
  const std::vector<FlatEntry>& entries = source.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!is_staged_tensor(entries[i].value)) continue;
    const at::Tensor& tensor = entries[i].value.toTensor();
    const int64_t bytes = staged_bytes(tensor);
    if (waves_.empty() || wave_bytes + bytes > budget_bytes) {
      waves_.emplace_back();
      wave_bytes = 0;
    }
    waves_.back().push_back(i);
    wave_bytes += bytes;
    buffer_bytes_ = std::max(buffer_bytes_, wave_bytes);
    if (!pin_ && !tensor.is_cpu()) {
      pin_ = true;
      pin_for_ = tensor.device().type();
    }
  }
}

void StagingWaves::stage_wave(const std::vector<size_t>& wave, const at::Tensor& buffer,
                              std::vector<c10::IValue>& data) const {
  int64_t offset = 0;
  for (const size_t index : wave) {
    const at::Tensor source = data.at(index).toTensor();
    const int64_t bytes = static_cast<int64_t>(source.numel()) * static_cast<int64_t>(source.element_size());
    // A contiguous tensor of the source's shape in the buffer: copy_ resolves lazy
    // conjugation and negation, as the writer would.
    at::Tensor staged = buffer.narrow(0, offset, bytes).view(source.scalar_type()).view(source.sizes());
    staged.copy_(source);
    data[index] = std::move(staged);
    offset += staged_bytes(source);
  }
}

std::vector<WriteResult> StagingWaves::write(StorageWriter& writer, const SavePlan& plan,
                                             std::vector<c10::IValue>& data) {
  memory::HostAllocOptions host{pin_, /*share_memory=*/false, pin_for_, memory::HostBufferUse::kCheckpoint};
  // One buffer for every wave, freed with the last reference to a staged view.
  const at::Tensor buffer = memory::allocate_host({buffer_bytes_}, c10::kByte, host);
  std::vector<WriteResult> results;
  for (size_t w = 0; w < waves_.size(); ++w) {
    stage_wave(waves_[w], buffer, data);
    if (w + 1 == waves_.size() && on_staged_) on_staged_();
    const std::set<size_t> in_wave(waves_[w].begin(), waves_[w].end());
    SavePlan part;
    part.rank = plan.rank;
    part.file_prefix = fmt::format("{}-w{}", plan.file_prefix, w);
    for (const WriteItem& item : plan.items) {
      if (item.kind == EntryKind::kTensor && in_wave.count(item.data_index) != 0) part.items.push_back(item);
    }
    std::vector<WriteResult> written = writer.write_data(part, data);
    results.insert(results.end(), std::make_move_iterator(written.begin()), std::make_move_iterator(written.end()));
  }
  if (waves_.empty() && on_staged_) on_staged_();
  return results;
}

}  // namespace detail
}  // namespace stowage::dcp
