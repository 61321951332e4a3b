#pragma once

// Read-only mappings of data files, and reads from them that survive the file
// shrinking underneath.
//
// Reading a page of a mapping beyond the file's current end raises SIGBUS. The reader
// checks every range against the file's size before mapping, so only a file truncated
// by someone else during a load can do that; the guarded reads below turn that SIGBUS
// into a `false` return instead of a crash. To that end a SIGBUS handler is installed
// once per process, at the first mapping: it resumes a guarded read of the faulting
// thread, and hands any other SIGBUS to the disposition installed before it.

#include "dcp/storage/file_io.h"

#include "dcp/format/hash_state.h"

#include <cstddef>
#include <cstdint>

namespace stowage::dcp::detail {

// The POSIX mapping behind Env::posix()'s ReadableFile::map.
class MappedFile final : public MappedRegion {
 public:
  // Maps the first `length` bytes of `file`, which must hold at least that many
  // (checked here with fstat: throws Error naming the file if it is shorter now).
  // length 0 maps nothing.
  MappedFile(const File& file, int64_t length);
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() override;

  const char* data() const override { return data_; }
  int64_t length() const override { return length_; }

 private:
  const char* data_ = nullptr;
  int64_t length_ = 0;
};

// XXH3_64bits_update(state, data, length); false if the mapping under `data` lost its
// pages (the file was truncated), leaving `state` unusable.
bool guarded_hash_update(XXH3_state_t* state, const char* data, size_t length);
// memcpy(destination, source, length); false if the mapping under `source` lost its
// pages, leaving `destination` partly written.
bool guarded_copy(char* destination, const char* source, size_t length);

}  // namespace stowage::dcp::detail
