#pragma once

// Reading one chunk (or a region of it) out of its data file's mapping, with every byte
// it hands out verified against the chunk's checksums.

#include <stowage/dcp/env.h>
#include <stowage/dcp/storage.h>

#include <cstdint>
#include <string>

namespace stowage::dcp::detail {

// A data file as FileSystemReader holds it: opened by read_metadata(), of `size` bytes
// then, mapped whole by the first read that needs it.
struct MappedDataFile {
  const ReadableFile* file = nullptr;
  int64_t size = 0;
  const MappedRegion* mapping = nullptr;  // null only for a read of no bytes
};

// Fills `read.buffer` with the bytes of `read.region` of its chunk (the whole chunk when
// unset), or with `verify_only` only verifies them, and sets `read.verified`. A read
// already verified is only copied. Returns the number of bytes whose checksums it
// computed.
//
// Throws, naming the checkpoint at `checkpoint`, the entry and the file:
//  - CorruptionError when the chunk lies outside the file, its length does not match its
//    shape, a checksum does not match, or the file shrank while being read;
//  - IoError (EIO) when a page of the mapping cannot be read;
//  - InvalidArgument when the buffer or region does not fit the chunk (a caller's bug).
int64_t read_chunk(const std::string& checkpoint, ChunkRead& read, const MappedDataFile& data, bool verify_only);

}  // namespace stowage::dcp::detail
