#include "util/intra_op_threads.h"

#include <stowage/dcp/staging.h>
#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/memory/skipped_sync.h>
#include <stowage/state/copy.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

namespace stowage::dcp {

// ------------------------------------------------------------------ AsyncStager

SaveableState AsyncStager::stage(const SaveableState&) {
  throw NotImplemented("AsyncStager::stage is not implemented: a stager must override it");
}

std::optional<std::shared_future<SaveableState>> AsyncStager::stage_in_background(const SaveableState&) {
  return std::nullopt;
}

namespace {

// Copies the whole storage of `source` into `bytes` (uint8, as many bytes).
void copy_storage(const at::Tensor& source, at::Tensor& bytes, bool non_blocking) {
  const c10::Storage& storage = source.storage();
  const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
  const at::Tensor source_bytes = at::empty({0}, source.options().dtype(c10::kByte)).set_(storage, 0, {nbytes}, {1});
  bytes.copy_(source_bytes, non_blocking);
}

// A view of `bytes` (a copy of the storage of `source`) exactly like the view `source`
// has of its own storage. The buffer starts at a multiple of kHostArenaAlignment in
// its arena, so at a whole number of elements.
at::Tensor view_like(const at::Tensor& source, const at::Tensor& bytes) {
  const int64_t offset = bytes.storage_offset() / static_cast<int64_t>(source.element_size()) + source.storage_offset();
  at::Tensor view = at::empty({0}, bytes.options().dtype(source.scalar_type()))
                        .set_(bytes.storage(), offset, source.sizes(), source.strides());
  // The storage holds unresolved bytes: carry the source's lazy conjugation/negation.
  if (source.is_conj()) view = view.conj();
  if (source.is_neg()) view = at::_neg_view(view);
  return view;
}

}  // namespace

// --------------------------------------------------------- BlockingAsyncStager

BlockingAsyncStager::BlockingAsyncStager(bool cache_staged_state_dict, bool type_check)
    : cache_staged_state_dict_(cache_staged_state_dict), type_check_(type_check) {}

SaveableState BlockingAsyncStager::stage(const SaveableState& state) {
  const FlatStateDict& source = state.leaves();
  if (cache_ && !state_dict_mismatch(source, *cache_, type_check_).empty()) {
    cache_.reset();  // the structure changed: stage into new buffers below
  }
  // Cached buffers are pinned, like PyTorch's cached staging, where the build can pin.
  const CpuStateDictOptions buffer_options{/*pin_memory=*/cache_staged_state_dict_, /*share_memory=*/false};
  FlatStateDict buffers = cache_ ? *cache_ : create_cpu_state_dict(source, buffer_options);
  SaveableState staged = state.with_leaves(copy_state_dict(source, buffers, /*non_blocking=*/false, type_check_));
  if (cache_staged_state_dict_) cache_ = std::move(buffers);
  return staged;
}

void BlockingAsyncStager::close() {
  cache_.reset();
}

// ---------------------------------------------------------------- DefaultStager

// A host copy of one source storage, reused while the source lives.
struct DefaultStager::CachedStorage {
  c10::weak_intrusive_ptr<c10::StorageImpl> source;
  at::Tensor bytes;  // uint8, the source storage's nbytes
};

DefaultStager::DefaultStager(StagingOptions options) : options_(options) {}

DefaultStager::~DefaultStager() {
  DefaultStager::close();  // named: a destructor calls no subclass's override anyway
}

int64_t DefaultStager::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  int64_t total = 0;
  for (const auto& item : cache_) total += item.second->bytes.numel();
  return total;
}

void DefaultStager::prepare_streams(const FlatStateDict& flat) {
  if (!options_.use_non_blocking_copy()) return;
  for (const FlatEntry& entry : flat.entries()) {
    if (!entry.value.isTensor() || !entry.value.toTensor().defined()) continue;
    const c10::Device device = entry.value.toTensor().device();
    if (device.is_cpu() || !c10::impl::hasDeviceGuardImpl(device.type())) continue;
    const c10::impl::VirtualGuardImpl impl(device.type());
    auto it = streams_.find(device.str());
    if (it == streams_.end()) {
      // Made here, on the caller's thread, so that staging never borrows the stream
      // the caller computes on.
      it = streams_.emplace(device.str(), impl.getStreamFromGlobalPool(device)).first;
    }
    // The copies must see everything already queued for the source tensors.
    c10::Event ready(device.type());
    ready.record(impl.getStream(device));
    ready.block(it->second);
  }
}

FlatStateDict DefaultStager::stage_now(const FlatStateDict& flat) {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  for (auto it = cache_.begin(); it != cache_.end();) {
    it = it->second->source.expired() ? cache_.erase(it) : std::next(it);
  }
  // The storages without a usable cached buffer get new ones, all from a few arenas.
  std::vector<const c10::Storage*> uncached;
  std::unordered_set<const void*> seen;
  std::vector<memory::HostTensorSpec> specs;
  memory::HostAllocOptions host_options{options_.use_pinned_memory(), options_.use_shared_memory()};
  host_options.use = memory::HostBufferUse::kCheckpoint;
  for (const FlatEntry& entry : flat.entries()) {
    if (!entry.value.isTensor()) continue;
    const c10::Storage& storage = entry.value.toTensor().storage();
    if (!storage.device().is_cpu()) host_options.pin_for = storage.device().type();
    const void* key = storage.unsafeGetStorageImpl();
    const auto it = cache_.find(key);
    if (it != cache_.end() && it->second->bytes.numel() == static_cast<int64_t>(storage.nbytes())) continue;
    if (!seen.insert(key).second) continue;
    uncached.push_back(&storage);
    specs.push_back(memory::HostTensorSpec{{static_cast<int64_t>(storage.nbytes())}, c10::kByte});
  }
  const std::vector<at::Tensor> buffers = memory::allocate_host_tensors(specs, host_options, kArenaBytes);
  for (size_t i = 0; i < uncached.size(); ++i) {
    cache_[uncached[i]->unsafeGetStorageImpl()] =
        std::make_shared<CachedStorage>(CachedStorage{uncached[i]->getWeakStorageImpl(), buffers[i]});
  }

  std::unordered_set<const void*> copied;  // storages already copied by this call
  std::vector<c10::Stream> used_streams;
  FlatStateDict staged;
  for (const FlatEntry& entry : flat.entries()) {
    if (!entry.value.isTensor()) {
      staged.add(FlatEntry{entry.fqn, entry.path, copy_leaf(entry.value)});  // lists and empty dicts are mutable
      continue;
    }
    const at::Tensor& source = entry.value.toTensor();
    const c10::Storage& storage = source.storage();
    const void* key = storage.unsafeGetStorageImpl();
    at::Tensor bytes = cache_.at(key)->bytes;
    if (copied.insert(key).second) {
      const auto stream = streams_.find(source.device().str());
      if (options_.use_non_blocking_copy() && stream != streams_.end()) {
        const c10::StreamGuard guard(stream->second);
        copy_storage(source, bytes, /*non_blocking=*/true);
        if (std::find(used_streams.begin(), used_streams.end(), stream->second) == used_streams.end()) {
          used_streams.push_back(stream->second);
        }
      } else {
        copy_storage(source, bytes, /*non_blocking=*/false);
      }
    }
    staged.add(FlatEntry{entry.fqn, entry.path, view_like(source, bytes)});
  }
  for (const c10::Stream& stream : used_streams) {
    if (!memory::sync_skipped(memory::SkippedSync::kStagingWait)) stream.synchronize();
  }
  return staged;
}

void DefaultStager::start_worker() {
  if (worker_.joinable()) return;
  stopping_ = false;
  worker_ = std::thread([this] { worker_loop(); });
}

void DefaultStager::worker_loop() {
  util::run_aten_serially_on_this_thread();
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to do
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

std::optional<std::shared_future<SaveableState>> DefaultStager::stage_in_background(const SaveableState& state) {
  if (!options_.use_async_staging()) return std::nullopt;
  prepare_streams(state.leaves());
  auto source = std::make_shared<SaveableState>(state);
  auto promise = std::make_shared<std::promise<SaveableState>>();
  std::shared_future<SaveableState> future = promise->get_future().share();
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    start_worker();
    queue_.push_back([this, source, promise] {
      try {
        promise->set_value(source->with_leaves(stage_now(source->leaves())));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
  }
  queue_cv_.notify_one();
  latest_ = future;
  return future;
}

SaveableState DefaultStager::stage(const SaveableState& state) {
  if (options_.use_async_staging()) {
    return stage_in_background(state)->get();
  }
  prepare_streams(state.leaves());
  return state.with_leaves(stage_now(state.leaves()));
}

void DefaultStager::synchronize_staging() {
  if (latest_.valid()) latest_.wait();
}

void DefaultStager::close() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();  // runs the queued jobs first
  latest_ = {};
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.clear();
}

}  // namespace stowage::dcp
