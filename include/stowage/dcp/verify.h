#pragma once

// Verification of a committed checkpoint without loading it: every chunk read and
// checked against its checksums, one chunk at a time (`stowage ckpt verify`).

#include <stowage/dcp/storage.h>

#include <cstdint>
#include <string>

namespace stowage::dcp {

struct VerifyReport {
  int64_t chunks_verified = 0;  // before the first failure, if any
  int64_t bytes_verified = 0;   // the tensor bytes of those chunks
  std::string error;            // the first failure (metadata or chunk), empty if none
  bool ok() const { return error.empty(); }
};

// Reads the metadata and every chunk through `reader`, holding at most one chunk's
// bytes. A bad checkpoint is reported, not thrown: the first failure ends the
// verification and is the report's error, which names the entry and the file.
VerifyReport verify(StorageReader& reader);

}  // namespace stowage::dcp
