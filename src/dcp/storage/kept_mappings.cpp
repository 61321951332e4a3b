#include "dcp/storage/kept_mappings.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace stowage::dcp::detail {

KeptMappings::~KeptMappings() {
  for (const Kept& kept : kept_) release(kept);
}

void KeptMappings::release(const Kept& kept) noexcept {
  ::munmap(kept.mapping, static_cast<size_t>(kept.size));
  ::close(kept.fd);
}

char* KeptMappings::take(int fd, int64_t size) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex_);
  release_unlinked_locked();
  const auto same_file = [&](const Kept& kept) {
    return kept.device == static_cast<uint64_t>(info.st_dev) && kept.inode == static_cast<uint64_t>(info.st_ino);
  };
  const auto found = std::find_if(kept_.begin(), kept_.end(), same_file);
  if (found == kept_.end()) return nullptr;
  const Kept kept = *found;
  kept_.erase(found);
  if (kept.size == size) {
    ::close(kept.fd);
    return kept.mapping;
  }
  release(kept);
  return nullptr;
}

void KeptMappings::keep(int fd, char* mapping, int64_t size) noexcept {
  struct stat info {};
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0 || ::fstat(copy, &info) != 0) {
    if (copy >= 0) ::close(copy);
    ::munmap(mapping, static_cast<size_t>(size));
    return;
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  kept_.push_back(Kept{copy, static_cast<uint64_t>(info.st_dev), static_cast<uint64_t>(info.st_ino), size, mapping});
  release_unlinked_locked();
  if (kept_.size() > kMaxKept) {
    release(kept_.front());
    kept_.erase(kept_.begin());
  }
}

void KeptMappings::release_unlinked() noexcept {
  const std::lock_guard<std::mutex> lock(mutex_);
  release_unlinked_locked();
}

void KeptMappings::release_unlinked_locked() noexcept {
  for (auto it = kept_.begin(); it != kept_.end();) {
    struct stat info {};
    if (::fstat(it->fd, &info) == 0 && info.st_nlink > 0) {
      ++it;
    } else {
      release(*it);
      it = kept_.erase(it);
    }
  }
}

}  // namespace stowage::dcp::detail
