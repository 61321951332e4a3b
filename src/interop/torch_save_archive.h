#pragma once

// One item of a PyTorch DCP data file: a complete torch.save zip archive (stored,
// uncompressed records under one prefix: data.pkl, data/<key>, ...) in a byte range of
// the file, read without executing anything. data.pkl goes through the restricted
// unpickler; every record read is checked against its zip CRC32.

#include "interop/restricted_unpickler.h"

#include <stowage/dcp/env.h>
#include <stowage/dcp/metadata.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>

namespace stowage::dcp::detail {

// The CRC-32 of zip (IEEE 802.3, reflected, as zlib's crc32()).
uint32_t crc32(const void* data, size_t length, uint32_t crc = 0);

class TorchSaveArchive {
 public:
  // Reads the archive's directory from bytes [offset, offset + length) of `file`, which
  // the caller checked lie inside it. `entry` (the checkpoint entry the item holds) and
  // `context` (e.g. "DCP checkpoint '<dir>'") go into errors. Throws CorruptionError
  // naming the entry, the file and the offset for anything but a zip archive of stored
  // records with its directory at the range's end.
  TorchSaveArchive(const ReadableFile& file, int64_t offset, int64_t length, std::string entry, std::string context);

  // The value of a non-tensor item: None, bool, int, float or str, or a list or tuple of
  // those (a list), or an empty dict (docs/FORMAT.md's values). Throws CorruptionError
  // for a malformed archive or pickle, Error naming the entry for a value stowage cannot
  // hold (a nested list, an object, an int beyond 64 bits).
  c10::IValue read_value() const;

  // Copies the box `region` (offsets relative to the tensor) of the item's tensor, which
  // must be of `dtype` and `shape`, into `out`: a contiguous CPU buffer of exactly the
  // region's bytes, row-major. The storage offset, sizes and strides of data.pkl are
  // honoured. Throws CorruptionError when the tensor is not what the metadata says or
  // a record fails its CRC.
  void read_tensor(c10::ScalarType dtype, const std::vector<int64_t>& shape, const ChunkBox& region,
                   const at::Tensor& out) const;

 private:
  struct Record {
    int64_t data_offset = 0;  // in the file
    int64_t size = 0;
    uint32_t crc = 0;
  };

  [[noreturn]] void fail(const std::string& what, int64_t file_offset) const;
  std::string read_at(int64_t offset, int64_t length) const;  // relative to the item
  void read_directory();
  void add_record(const std::string& name, uint16_t method, uint32_t crc, int64_t size, int64_t local_header);
  const Record& record(const std::string& name) const;
  // The record's bytes into `out` (`size` bytes), checked against its CRC.
  void read_record(const std::string& name, const Record& record, void* out) const;
  std::string read_pickle() const;
  // data.pkl decoded with these globals (null: none), persistent ids only for a tensor.
  PickleRef unpickle_data(const std::vector<AllowedGlobal>* globals, bool allow_persistent_ids) const;

  const ReadableFile& file_;
  int64_t offset_;
  int64_t length_;
  std::string entry_;
  std::string context_;
  std::string prefix_;                     // of every record, e.g. "archive/"
  std::map<std::string, Record> records_;  // by name without the prefix
};

}  // namespace stowage::dcp::detail
