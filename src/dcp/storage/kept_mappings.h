#pragma once

// The shared mappings of files written over (OverwrittenFile), kept after the file is
// closed, so that the next write over the same file skips faulting its pages in again
// and the close skips unmapping them: on tmpfs each costs about as much as a third of
// the copy (issue 40). The memory tier writes over the same few files in turn; their
// mappings go round with them.
//
// Invariants: a kept mapping covers exactly its file's size when it was kept, and is
// handed out again only for the same file (device and inode) at that size. A kept
// mapping holds its file's pages: one whose file is unlinked (no name left) is released
// at the next take() or release_unlinked(), and at most kMaxKept are kept (the oldest
// goes first).

#include <cstdint>
#include <mutex>
#include <vector>

namespace stowage::dcp::detail {

class KeptMappings {
 public:
  static constexpr size_t kMaxKept = 8;

  KeptMappings() = default;
  KeptMappings(const KeptMappings&) = delete;
  KeptMappings& operator=(const KeptMappings&) = delete;
  ~KeptMappings();

  // The kept mapping of the file open as `fd` if it covers exactly `size` bytes (the
  // caller owns it then: it munmaps it or keeps it again); else nullptr, and a kept
  // mapping of that file at another size is released.
  char* take(int fd, int64_t size);
  // Keeps `mapping`, `size` bytes of the file open as `fd`. REQUIRES: the file has
  // exactly `size` bytes. Never throws: what cannot be kept is unmapped.
  void keep(int fd, char* mapping, int64_t size) noexcept;
  // Releases the mappings of files that have no name left.
  void release_unlinked() noexcept;

 private:
  struct Kept {
    int fd;  // a duplicate, to tell whether the file still has a name
    uint64_t device;
    uint64_t inode;
    int64_t size;
    char* mapping;
  };
  static void release(const Kept& kept) noexcept;
  void release_unlinked_locked() noexcept;

  std::mutex mutex_;
  std::vector<Kept> kept_;  // oldest first; guarded by mutex_
};

}  // namespace stowage::dcp::detail
