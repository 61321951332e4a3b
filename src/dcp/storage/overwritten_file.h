#pragma once

// A file written over in place (Env::reuse_file's, on the process's file system): the
// bytes it has, through a shared mapping whose pages are faulted in once when it is
// opened (or kept from its last write over: kept_mappings.h); anything past them,
// through pwrite. On tmpfs this is what makes a write run at memory speed: write() into
// new pages allocates and zeroes each one and copies it through the kernel, a store into
// pages the file has is a memcpy.
//
// Invariant: the mapping covers exactly the file's size at opening, and nothing else
// shortens the file while it is open (the tier that reuses it owns its directory), so
// no store can fault past its end.

#include "dcp/storage/file_io.h"
#include "dcp/storage/kept_mappings.h"

#include <stowage/dcp/env.h>

#include <cstdint>
#include <memory>
#include <string>

namespace stowage::dcp::detail {

class OverwrittenFile final : public WritableFile {
 public:
  // Renames the regular file `from` to `to` and opens it to be written over, through
  // its mapping in `kept` if there is one. IoError naming the path and the call that
  // failed ("rename", "open", "mmap"). REQUIRES: `kept` outlives the file.
  static std::unique_ptr<WritableFile> open(const std::string& from, const std::string& to, KeptMappings& kept);
  ~OverwrittenFile() override;
  OverwrittenFile(const OverwrittenFile&) = delete;
  OverwrittenFile& operator=(const OverwrittenFile&) = delete;

  const std::string& path() const override { return file_.path(); }
  void write_at(const void* data, int64_t length, int64_t offset) override;
  void start_writeback(int64_t offset, int64_t length) override;
  void sync() override;
  // Truncates it to the end of what was written ("truncate"). The mapping is kept when
  // it still covers the whole file, else unmapped.
  void close() override;

 private:
  OverwrittenFile(File file, char* mapping, int64_t mapped, KeptMappings& kept);
  void unmap() noexcept;

  File file_;
  KeptMappings& kept_;
  char* mapping_;
  int64_t mapped_;
  int64_t end_ = 0;  // past the last byte written
};

}  // namespace stowage::dcp::detail
