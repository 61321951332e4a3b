#include <stowage/dcp/staging.h>
#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/copy.h>

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

namespace stowage::dcp {

// ------------------------------------------------------------------ AsyncStager

StateDict AsyncStager::stage(const StateDict&) {
  throw NotImplemented("AsyncStager::stage is not implemented: a stager must override it");
}

std::optional<std::shared_future<StateDict>> AsyncStager::stage_in_background(const StateDict&) {
  return std::nullopt;
}

// --------------------------------------------------------- BlockingAsyncStager

BlockingAsyncStager::BlockingAsyncStager(bool cache_staged_state_dict, bool type_check)
    : cache_staged_state_dict_(cache_staged_state_dict), type_check_(type_check) {}

StateDict BlockingAsyncStager::stage(const StateDict& state) {
  if (!cache_staged_state_dict_) {
    StateDict staged = create_cpu_state_dict(state);
    copy_state_dict(state, staged, /*non_blocking=*/false, type_check_);
    return staged;
  }
  if (cache_) {
    try {
      copy_state_dict(state, *cache_, /*non_blocking=*/false, type_check_);
      return deep_copy_structure(*cache_);
    } catch (const InvalidArgument&) {
      cache_.reset();  // the structure changed: stage into new buffers below
    }
  }
  // Pinned, like PyTorch's cached staging, where the build can pin.
  StateDict cache = create_cpu_state_dict(state, CpuStateDictOptions{/*pin_memory=*/true, /*share_memory=*/false});
  copy_state_dict(state, cache, /*non_blocking=*/false, type_check_);
  cache_ = cache;
  return deep_copy_structure(cache);
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
  close();
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

StateDict DefaultStager::stage_now(const FlatStateDict& flat) {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  for (auto it = cache_.begin(); it != cache_.end();) {
    it = it->second->source.expired() ? cache_.erase(it) : std::next(it);
  }
  const memory::HostAllocOptions alloc{options_.use_pinned_memory(), options_.use_shared_memory()};
  std::unordered_map<const void*, at::Tensor> copied;  // storages already copied by this call
  std::vector<c10::Stream> used_streams;
  FlatStateDict staged;
  for (const FlatEntry& entry : flat.entries()) {
    c10::IValue value = entry.value;
    if (value.isList()) {
      value = value.toList().copy();  // lists are mutable: the snapshot gets its own
    } else if (value.isTensor()) {
      const at::Tensor& source = value.toTensor();
      const c10::Storage& storage = source.storage();
      const void* key = storage.unsafeGetStorageImpl();
      auto done = copied.find(key);
      if (done == copied.end()) {
        const int64_t nbytes = static_cast<int64_t>(storage.nbytes());
        std::shared_ptr<CachedStorage>& cached = cache_[key];
        if (!cached || cached->source.expired() || cached->bytes.numel() != nbytes) {
          cached = std::make_shared<CachedStorage>(
              CachedStorage{storage.getWeakStorageImpl(), memory::allocate_host({nbytes}, c10::kByte, alloc)});
        }
        const at::Tensor source_bytes =
            at::empty({0}, source.options().dtype(c10::kByte)).set_(storage, 0, {nbytes}, {1});
        const auto stream = streams_.find(source.device().str());
        if (options_.use_non_blocking_copy() && stream != streams_.end()) {
          const c10::StreamGuard guard(stream->second);
          cached->bytes.copy_(source_bytes, /*non_blocking=*/true);
          if (std::find(used_streams.begin(), used_streams.end(), stream->second) == used_streams.end()) {
            used_streams.push_back(stream->second);
          }
        } else {
          cached->bytes.copy_(source_bytes);
        }
        done = copied.emplace(key, cached->bytes).first;
      }
      // A view of the staged storage exactly like the source's view of its own.
      at::Tensor view = at::empty({0}, done->second.options().dtype(source.scalar_type()))
                            .set_(done->second.storage(), source.storage_offset(), source.sizes(), source.strides());
      // The storage holds unresolved bytes: carry the source's lazy conjugation/negation.
      if (source.is_conj()) view = view.conj();
      if (source.is_neg()) view = at::_neg_view(view);
      value = std::move(view);
    }
    staged.add(FlatEntry{entry.fqn, entry.path, std::move(value)});
  }
  for (const c10::Stream& stream : used_streams) {
    stream.synchronize();
  }
  return unflatten_state_dict(staged);
}

void DefaultStager::start_worker() {
  if (worker_.joinable()) return;
  stopping_ = false;
  worker_ = std::thread([this] { worker_loop(); });
}

void DefaultStager::worker_loop() {
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

std::optional<std::shared_future<StateDict>> DefaultStager::stage_in_background(const StateDict& state) {
  if (!options_.use_async_staging()) return std::nullopt;
  auto flat = std::make_shared<FlatStateDict>(flatten_state_dict(state));  // errors surface here
  prepare_streams(*flat);
  auto promise = std::make_shared<std::promise<StateDict>>();
  std::shared_future<StateDict> future = promise->get_future().share();
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    start_worker();
    queue_.push_back([this, flat, promise] {
      try {
        promise->set_value(stage_now(*flat));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
  }
  queue_cv_.notify_one();
  latest_ = future;
  return future;
}

StateDict DefaultStager::stage(const StateDict& state) {
  if (options_.use_async_staging()) {
    return stage_in_background(state)->get();
  }
  const FlatStateDict flat = flatten_state_dict(state);
  prepare_streams(flat);
  return stage_now(flat);
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
