#pragma once

// What a stowage::dist::ProcessGroup is inside: c10d's store and Gloo backend, and the
// group's failure record. Private to src/dist (process_group.cpp runs the collectives,
// init_process_group.cpp joins the first group).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO  // the c10d headers declare ProcessGroupGloo only under it
#endif

#include <stowage/dist/process_group.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace stowage::dist {

// What the collectives run on: ProcessGroupGloo's base class, which c10d renamed.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CollectiveBackend> backend;         // Gloo
  c10::intrusive_ptr<CollectiveBackend> device_backend;  // NCCL, made on first use
  int64_t rank = 0;
  int64_t size = 1;
  std::chrono::milliseconds timeout{};
  std::chrono::milliseconds check_in_timeout{};
  std::string name;
  // The rank whose process hosts the TCPStore (-1: torchrun's agent does): when the
  // store is unreachable, that rank is gone.
  int64_t store_host = 0;

  // Set once a collective failed: the group is out of step for good. Only the thread
  // that runs the group's collectives touches it (they run one at a time).
  std::optional<CollectiveError> failure;

  std::mutex mutex;  // guards attachments
  std::map<std::string, std::shared_ptr<void>> attachments;
};

// Gloo over `store` for `rank` of `size` (GLOO_SOCKET_IFNAME picks its interface). Throws
// what c10d throws when it cannot connect.
c10::intrusive_ptr<CollectiveBackend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                                                int64_t size, std::chrono::milliseconds timeout);

}  // namespace stowage::dist
