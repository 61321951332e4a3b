#pragma once

// The pages of a memory tier's dropped checkpoints, written over by its next saves
// (issue 40). On tmpfs a write into new pages allocates, zeroes and copies each one
// through the kernel; stores into pages a file has run about three times as fast
// (Env::reuse_file). So a checkpoint the tier drops is retired rather than removed: made
// uncommitted first, as remove_checkpoint does (its metadata removed, the directory
// synced), then its data files moved into a spare directory, then the rest removed. A
// writer given this Env then takes a spare file for each data file it makes.
//
// Invariants: a spare file is never part of a committed checkpoint (it is moved only
// after its checkpoint lost its metadata, and taken only under an uncommitted one's
// name); the spare directory holds at most kMaxSpareFiles files, so the tier's host
// memory stays that of keep_last + 1 checkpoints. The spare directory is not a step
// directory: list_checkpoints does not see it; held_bytes() counts it.

#include <stowage/dcp/env.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stowage::dcp {

class PageRecycler final : public EnvWrapper {
 public:
  // A checkpoint of the memory tier has one data file (one writer thread): one spare.
  static constexpr int64_t kMaxSpareFiles = 1;

  PageRecycler(Env* target, std::string spare_directory);

  // A data file of stowage's naming ("data-..."): the largest spare file renamed to
  // `path` and written over; anything else, or with no spare file, a new one.
  std::unique_ptr<WritableFile> create_file(const std::string& path) override;

  // Retires the checkpoint `path` (see above); nothing when it is absent.
  void retire(const std::string& path);

 private:
  // The spare files, largest first.
  std::vector<std::string> spare_files();

  std::string spare_directory_;
};

}  // namespace stowage::dcp
