#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include "util/errno_error.h"

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>
#include <c10/util/irange.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#if defined(STOWAGE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if TORCH_VERSION_MAJOR >= 2
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#endif

namespace stowage::memory {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_pinned{0};
std::atomic<int64_t> g_shared{0};
std::atomic<int64_t> g_checkpoint{0};
std::atomic<int64_t> g_optimizer{0};
std::atomic<int64_t> g_checkpoint_peak{0};

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

void account(int64_t delta, bool pinned, bool shared, HostBufferUse use) {
  const int64_t now = g_current.fetch_add(delta) + delta;
  if (pinned) g_pinned.fetch_add(delta);
  if (shared) g_shared.fetch_add(delta);
  if (use == HostBufferUse::kCheckpoint) raise_to(g_checkpoint_peak, g_checkpoint.fetch_add(delta) + delta);
  if (use == HostBufferUse::kOptimizer) g_optimizer.fetch_add(delta);
  raise_to(g_peak, now);
}

bool pin(void* data, size_t nbytes) {
#if defined(STOWAGE_WITH_CUDA)
  return cudaHostRegister(data, nbytes, cudaHostRegisterPortable) == cudaSuccess;
#else
  (void)data;
  (void)nbytes;
  return false;
#endif
}

void unpin(void* data) {
#if defined(STOWAGE_WITH_CUDA)
  cudaHostUnregister(data);
#else
  (void)data;
#endif
}

#if TORCH_VERSION_MAJOR >= 2
// The pinned-memory allocator registered for a device type other than CUDA, or null. (CUDA
// pins the pages allocate_host maps, in place, which also works for shared memory.)
at::HostAllocator* pinned_allocator_for(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::CUDA) return nullptr;
  try {
    return at::getHostAllocator(device_type);
  } catch (const c10::Error&) {  // none registered
    return nullptr;
  }
}

// `nbytes` of pinned memory from `allocator`, accounted as such until freed.
at::Tensor allocate_pinned(at::HostAllocator& allocator, c10::IntArrayRef sizes, c10::ScalarType dtype, size_t nbytes,
                           HostBufferUse use) {
  auto data = std::make_shared<at::DataPtr>(allocator.allocate(nbytes));
  account(static_cast<int64_t>(nbytes), /*pinned=*/true, /*shared=*/false, use);
  auto release = [data, nbytes, use](void*) mutable {
    data.reset();
    account(-static_cast<int64_t>(nbytes), /*pinned=*/true, /*shared=*/false, use);
  };
  return at::from_blob(data->get(), sizes, release, at::TensorOptions().dtype(dtype).device(c10::kCPU));
}
#endif

}  // namespace

bool can_pin_memory(c10::DeviceType device_type) {
  if (device_type == c10::DeviceType::CUDA) {
#if defined(STOWAGE_WITH_CUDA)
    return at::detail::getCUDAHooks().hasCUDA();
#else
    return false;
#endif
  }
#if TORCH_VERSION_MAJOR >= 2
  return pinned_allocator_for(device_type) != nullptr;
#else
  return false;
#endif
}

bool is_pinned(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_cpu()) return false;
#if TORCH_VERSION_MAJOR >= 2
  // Asked of each accelerator: Tensor::is_pinned() asks only the one at::getAccelerator()
  // picks, which is a registered PrivateUse1 device even where CUDA is present too.
  const void* data = tensor.storage().data();
  if (can_pin_memory(c10::DeviceType::CUDA) && at::detail::getCUDAHooks().isPinnedPtr(data)) return true;
  return at::isPrivateUse1HooksRegistered() && at::detail::getPrivateUse1Hooks().isPinnedPtr(data);
#else
  return tensor.is_pinned();
#endif
}

int64_t host_allocation_bytes(int64_t nbytes) {
  const auto page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return (nbytes + page - 1) / page * page;
}

at::Tensor allocate_host(c10::IntArrayRef sizes, c10::ScalarType dtype, HostAllocOptions options) {
  int64_t numel = 1;
  for (const int64_t size : sizes) {
    if (size < 0) {
      throw InvalidArgument(fmt::format("allocate_host: negative size in [{}]", fmt::join(sizes, ", ")));
    }
    numel *= size;
  }
  const auto tensor_options = at::TensorOptions().dtype(dtype).device(c10::kCPU);
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (nbytes == 0) {
    return at::empty(sizes, tensor_options);
  }
  const auto mapped = static_cast<size_t>(host_allocation_bytes(static_cast<int64_t>(nbytes)));
#if TORCH_VERSION_MAJOR >= 2
  if (options.pin_memory && !options.share_memory) {
    if (at::HostAllocator* allocator = pinned_allocator_for(options.pin_for)) {
      return allocate_pinned(*allocator, sizes, dtype, mapped, options.use);
    }
  }
#endif

  int fd = -1;
  void* data = MAP_FAILED;
  if (options.share_memory) {
    fd = memfd_create("stowage-host-buffer", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      util::throw_errno(fmt::format("allocate_host: cannot create {} bytes of shared memory", mapped), "",
                        "memfd_create", err);
    }
    data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (data == MAP_FAILED) {
    const int err = errno;
    if (fd >= 0) close(fd);
    util::throw_errno(fmt::format("allocate_host: cannot map {} bytes", mapped), "", "mmap", err);
  }
  const bool pinned =
      options.pin_memory && options.pin_for == c10::DeviceType::CUDA && can_pin_memory() && pin(data, mapped);
  const bool shared = fd >= 0;
  const HostBufferUse use = options.use;
  account(static_cast<int64_t>(mapped), pinned, shared, use);
  auto release = [mapped, fd, pinned, shared, use](void* ptr) {
    if (pinned) unpin(ptr);
    munmap(ptr, mapped);
    if (fd >= 0) close(fd);
    account(-static_cast<int64_t>(mapped), pinned, shared, use);
  };
  return at::from_blob(data, sizes, release, tensor_options);
}

std::vector<at::Tensor> allocate_host_tensors(const std::vector<HostTensorSpec>& specs, HostAllocOptions options,
                                              int64_t max_arena_bytes) {
  std::vector<int64_t> nbytes;
  nbytes.reserve(specs.size());
  for (const HostTensorSpec& spec : specs) {
    int64_t numel = 1;
    for (const int64_t size : spec.sizes) {
      if (size < 0) {
        throw InvalidArgument(fmt::format("allocate_host_tensors: negative size in [{}]", fmt::join(spec.sizes, ", ")));
      }
      numel *= size;
    }
    nbytes.push_back(numel * static_cast<int64_t>(c10::elementSize(spec.dtype)));
  }
  std::vector<at::Tensor> tensors;
  tensors.reserve(specs.size());
  std::vector<int64_t> offsets;
  for (size_t first = 0; first < specs.size();) {
    // The specs from `first` that fit one arena (at least one).
    offsets.clear();
    int64_t arena_bytes = 0;
    size_t end = first;
    for (; end < specs.size(); ++end) {
      const int64_t offset = (arena_bytes + kHostArenaAlignment - 1) / kHostArenaAlignment * kHostArenaAlignment;
      if (end > first && offset + nbytes[end] > max_arena_bytes) break;
      offsets.push_back(offset);
      arena_bytes = offset + nbytes[end];
    }
    const c10::Storage arena = allocate_host({arena_bytes}, c10::kByte, options).storage();
    for (size_t i = first; i < end; ++i) {
      const int64_t element = static_cast<int64_t>(c10::elementSize(specs[i].dtype));
      tensors.push_back(at::empty({0}, at::TensorOptions().dtype(specs[i].dtype).device(c10::kCPU))
                            .set_(arena, offsets[i - first] / element, specs[i].sizes));
    }
    first = end;
  }
  return tensors;
}

HostBufferStats host_buffer_stats() {
  return {g_current.load(),    g_peak.load(),      g_pinned.load(),         g_shared.load(),
          g_checkpoint.load(), g_optimizer.load(), g_checkpoint_peak.load()};
}

void reset_peak_host_buffer_stats() {
  g_peak.store(g_current.load());
  g_checkpoint_peak.store(g_checkpoint.load());
}

}  // namespace stowage::memory
