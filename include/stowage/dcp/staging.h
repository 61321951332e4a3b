#pragma once

// Stagers: turn a live state into a training-safe snapshot (a CPU copy that later
// updates of the source never reach), so that an async_save can write it while
// training goes on. Names and defaults follow torch.distributed.checkpoint.staging; a
// stager stages the SaveableState that async_save made (flattened and checked once),
// where PyTorch's takes the state dict itself.

#include <stowage/dcp/metadata.h>
#include <stowage/dcp/saveable_state.h>
#include <stowage/state/state_dict.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/arg.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

namespace stowage::dcp {

// What staging `state` takes in host memory, the figures a budget is checked against
// (AsyncSaveOptions::staging_budget_bytes): every tensor entry is staged whole, into a
// buffer at a memory::kHostArenaAlignment boundary.
struct StagingFootprint {
  int64_t entries = 0;              // tensor entries
  int64_t total_bytes = 0;          // every tensor entry's
  int64_t largest_entry_bytes = 0;  // the smallest budget that fits: waves of one entry
  std::string largest_entry;        // its name (fqn)
};
StagingFootprint staging_footprint(const SaveableState& state);

// The staging protocol async_save drives.
class AsyncStager {
 public:
  virtual ~AsyncStager() = default;

  // Whether async_save calls synchronize_staging() right after it starts the write.
  virtual bool should_synchronize_after_execute() const { return true; }
  // A snapshot of `state` (state.with_leaves of the copies), blocking until it is
  // complete. The base throws NotImplemented.
  virtual SaveableState stage(const SaveableState& state);
  // Starts staging in the background and returns its future, or returns nullopt when
  // this stager only stages synchronously (async_save then calls stage()). This is the
  // C++ form of PyTorch's stage() returning either a Future or a state dict.
  virtual std::optional<std::shared_future<SaveableState>> stage_in_background(const SaveableState& state);
  // Waits for staging to finish; a no-op here.
  virtual void synchronize_staging() {}
  // Releases what the stager holds; a no-op here.
  virtual void close() {}
  // Whether a later staging may overwrite the buffers of an earlier snapshot (the
  // stager caches them). async_save then never lets a staging of this stager overwrite
  // a snapshot still being written, whichever writer writes it: before staging it waits
  // for the save that writes the stager's previous snapshot, or rejects under
  // PendingSave::kReject, exactly as for a save in flight on the writer. So one
  // caching stager may serve several writers. A stager that returns false (the
  // default) must give every snapshot buffers of its own.
  virtual bool reuses_buffers() const { return false; }

 private:
  friend class PendingSaveAccess;
  // The upload of the latest async_save that staged with this stager, while
  // reuses_buffers().
  std::shared_future<Metadata> latest_save_;
};

// Stages on the caller's thread into CPU memory (PyTorch's BlockingAsyncStager).
// The snapshot is always a copy, also for CPU sources (PyTorch bug #144657), of every
// leaf: it shares nothing mutable with the source. With caching, the first call
// allocates the buffers and later calls refresh them in place (same data pointers) as
// long as the state dict keeps its structure; a different structure gets new buffers.
// Sharing: uncached, every snapshot has buffers of its own, so one stager may serve any
// number of writers and saves at once. Cached, a later stage() overwrites the previous
// snapshot; async_save waits for the save writing it first (reuses_buffers()), so
// sharing one cached stager between writers is safe through async_save. Not
// thread-safe: one caller at a time.
class BlockingAsyncStager : public AsyncStager {
 public:
  explicit BlockingAsyncStager(bool cache_staged_state_dict = false, bool type_check = false);

  bool should_synchronize_after_execute() const override { return false; }
  SaveableState stage(const SaveableState& state) override;
  void synchronize_staging() override {}
  // Drops the cached buffers.
  void close() override;
  bool reuses_buffers() const override { return cache_staged_state_dict_; }

  bool cache_staged_state_dict() const { return cache_staged_state_dict_; }

 private:
  bool cache_staged_state_dict_;
  bool type_check_;
  std::optional<FlatStateDict> cache_;
};

struct StagingOptions {
  StagingOptions() = default;
  // The four switches in PyTorch's order.
  StagingOptions(bool pinned, bool shared, bool async_staging, bool non_blocking)
      : use_pinned_memory_(pinned),
        use_shared_memory_(shared),
        use_async_staging_(async_staging),
        use_non_blocking_copy_(non_blocking) {}

  // Page-locked staging buffers for the device the staged tensors live on, where its
  // runtime can pin (see memory::can_pin_memory; a device other than CUDA cannot pin
  // shared memory, so use_shared_memory must be off for it).
  TORCH_ARG(bool, use_pinned_memory) = true;
  // Staging buffers another process can map (memfd-backed).
  TORCH_ARG(bool, use_shared_memory) = true;
  // Stage on a background thread: stage_in_background() returns at once.
  TORCH_ARG(bool, use_async_staging) = true;
  // Device-to-host copies are issued non-blocking on a stream of the stager's own and
  // awaited once, where the device has streams. CPU sources are copied by the staging
  // thread itself.
  TORCH_ARG(bool, use_non_blocking_copy) = true;
};

// The staging engine of PyTorch's zero-overhead checkpointing (DefaultStager): copies
// every storage once per call into a host buffer cached across calls (keyed by the
// source storage, dropped when that dies), so views that share a storage in the source
// share one in the snapshot. Non-tensor leaves are copied (copy_leaf): the snapshot
// shares nothing mutable with the source. The buffers a call needs anew are carved out
// of a few arenas (memory::allocate_host_tensors, up to kArenaBytes each), so that
// shared-memory descriptors, mappings and pin registrations grow with the bytes staged,
// not with the number of tensors; an arena is freed when the last buffer in it (cached,
// or held by a snapshot) goes.
// Not thread-safe: one caller at a time. Staging again overwrites the previous
// snapshot in place; async_save waits for the save writing it first (reuses_buffers()
// is true), also when that save runs on another writer, so one DefaultStager may serve
// several writers through async_save. close() may run while a save still writes its
// snapshot: the snapshot holds its own references to the buffers.
class DefaultStager : public AsyncStager {
 public:
  explicit DefaultStager(StagingOptions options = StagingOptions());
  ~DefaultStager() override;  // close()

  SaveableState stage(const SaveableState& state) override;
  std::optional<std::shared_future<SaveableState>> stage_in_background(const SaveableState& state) override;
  // Waits for the latest staging to finish (its errors stay in its future).
  void synchronize_staging() override;
  // Waits for staging in flight, stops the staging thread and frees every cached
  // buffer. The stager can stage again afterwards.
  void close() override;

  bool reuses_buffers() const override { return true; }

  // The largest arena staging allocates at once (one tensor larger than that gets an
  // arena of its own).
  static constexpr int64_t kArenaBytes = int64_t(1) << 30;

  const StagingOptions& options() const { return options_; }
  // Bytes of host buffers the stager holds now.
  int64_t cached_bytes() const;

 private:
  struct CachedStorage;
  FlatStateDict stage_now(const FlatStateDict& flat);
  void start_worker();
  void worker_loop();
  // The stager's own stream on `device` (made on first use, on the caller's thread),
  // ordered after the work already queued on the device's current stream.
  void prepare_streams(const FlatStateDict& flat);

  StagingOptions options_;
  mutable std::mutex cache_mutex_;
  std::unordered_map<const void*, std::shared_ptr<CachedStorage>> cache_;
  std::map<std::string, c10::Stream> streams_;  // by device string

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread worker_;
  std::shared_future<SaveableState> latest_;
};

}  // namespace stowage::dcp
