#include "dcp/storage/chunk_reader.h"

#include "dcp/format/checks.h"
#include "dcp/format/hash_state.h"
#include "dcp/storage/mapped_file.h"
#include "util/errno_error.h"

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace stowage::dcp::detail {
namespace {

// A contiguous byte range of a chunk, relative to the chunk's first byte.
struct ByteRun {
  int64_t begin = 0;
  int64_t length = 0;
};

// The byte runs of `region` within a row-major chunk of `sizes`, in order (adjacent
// rows merged where the region spans whole rows).
std::vector<ByteRun> runs_of(const std::vector<int64_t>& sizes, const ChunkBox& region, int64_t element_bytes) {
  const size_t dims = sizes.size();
  std::vector<int64_t> strides(dims, element_bytes);  // in bytes
  for (size_t d = dims; d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  // Dimensions from `inner` on are contiguous in the chunk: all but the first of them
  // are spanned whole by the region.
  size_t inner = dims;
  int64_t run_length = element_bytes;
  while (inner > 0) {
    --inner;
    run_length *= region.sizes[inner];
    if (region.sizes[inner] != sizes[inner]) break;
  }
  std::vector<ByteRun> runs;
  if (run_length == 0) return runs;
  // Walk the outer dimensions' indices like an odometer.
  std::vector<int64_t> index(inner, 0);
  for (;;) {
    int64_t begin = 0;
    for (size_t d = 0; d < dims; ++d) begin += (region.offsets[d] + (d < inner ? index[d] : 0)) * strides[d];
    runs.push_back(ByteRun{begin, run_length});
    size_t d = inner;
    while (d > 0 && ++index[d - 1] == region.sizes[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return runs;
}

// One read_chunk() call. Invariant, once check_layout() has passed: the region lies
// inside the chunk, the chunk inside the file's first `size` bytes (the mapping), and
// the buffer is exactly as large as the region.
class ChunkReader {
 public:
  ChunkReader(const std::string& checkpoint, ChunkRead& read, const MappedDataFile& data)
      : checkpoint_(checkpoint),
        read_(read),
        data_(data),
        location_(read.chunk->location),
        element_bytes_(element_size(read.entry->dtype)),
        region_(read.region.value_or(
            ChunkBox{std::vector<int64_t>(read.chunk->box.sizes.size(), 0), read.chunk->box.sizes})) {}

  int64_t run(bool verify_only) {
    check_layout();
    if (location_.length == 0) {
      read_.verified = true;
      return 0;
    }
    chunk_bytes_ = data_.mapping->data() + location_.offset;
    out_ = static_cast<char*>(read_.buffer.data_ptr());
    return wanted_ == location_.length ? read_whole(verify_only) : read_region(verify_only);
  }

 private:
  std::string where() const {
    return fmt::format("checkpoint '{}': entry '{}': data file '{}'", checkpoint_, read_.entry->fqn, location_.file);
  }

  // An empty chunk reads nothing, so it may sit past the file's end (the writer aligns
  // its offset without writing a byte), as check_chunk_ranges allows.
  void check_layout() {
    const bool outside =
        location_.length > 0 && (location_.offset > data_.size || location_.length > data_.size - location_.offset);
    if (location_.offset < 0 || location_.length < 0 || outside) {
      throw CorruptionError(fmt::format("{} is truncated: it has {} bytes, the chunk needs bytes {} to {}", where(),
                                        data_.size, location_.offset, location_.offset + location_.length),
                            read_.entry->fqn, data_.file->path(), data_.size);
    }
    const std::vector<int64_t>& chunk_sizes = read_.chunk->box.sizes;
    wanted_ = checked_volume(region_.sizes, read_.entry->fqn) * element_bytes_;
    const at::Tensor& buffer = read_.buffer;
    if (buffer.nbytes() != static_cast<size_t>(wanted_) || !buffer.is_contiguous() || !buffer.device().is_cpu() ||
        region_.offsets.size() != chunk_sizes.size() || region_.sizes.size() != chunk_sizes.size()) {
      throw InvalidArgument(where() + ": the read buffer does not match the region read");
    }
    for (size_t d = 0; d < chunk_sizes.size(); ++d) {
      if (region_.offsets[d] < 0 || region_.sizes[d] < 0 || region_.offsets[d] > chunk_sizes[d] ||
          region_.sizes[d] > chunk_sizes[d] - region_.offsets[d]) {
        throw InvalidArgument(where() + ": the region read is not inside the chunk");
      }
    }
    if (checked_volume(chunk_sizes, read_.entry->fqn) * element_bytes_ != location_.length) {
      throw CorruptionError(where() + ": the chunk's length does not match its shape", read_.entry->fqn,
                            data_.file->path(), location_.offset);
    }
  }

  // A guarded read of the mapping faulted: the file shrank, or the device could not read
  // a page (the kernel signals an I/O error on a mapped file the same way).
  [[noreturn]] void throw_unreadable() const {
    const int64_t size_now = data_.file->size();
    if (size_now < data_.size) {
      throw CorruptionError(fmt::format("{} was truncated while being read: it has {} bytes now", where(), size_now),
                            read_.entry->fqn, data_.file->path(), size_now);
    }
    util::throw_errno(
        fmt::format("{}: cannot read '{}' (a page of its mapping could not be read)", where(), data_.file->path()),
        data_.file->path(), "read", EIO);
  }

  // Chunk bytes [chunk_offset, + length) into `destination`.
  void copy(char* destination, int64_t chunk_offset, int64_t length) const {
    if (!guarded_copy(destination, chunk_bytes_ + chunk_offset, static_cast<size_t>(length))) throw_unreadable();
  }

  // Throws CorruptionError unless chunk bytes [begin, + length) have checksum `expected`.
  void verify_block(int64_t begin, int64_t length, uint64_t expected) const {
    const HashState state = new_hash_state();
    if (!guarded_hash_update(state.get(), chunk_bytes_ + begin, static_cast<size_t>(length))) throw_unreadable();
    check_checksum(begin, length, XXH3_64bits_digest(state.get()), expected);
  }

  void check_checksum(int64_t begin, int64_t length, uint64_t actual, uint64_t expected) const {
    if (actual == expected) return;
    const int64_t offset = location_.offset + begin;
    throw CorruptionError(
        fmt::format("{} is corrupt: the bytes at offset {} ({} bytes) have checksum {:016x}, expected {:016x}", where(),
                    offset, length, actual, expected),
        read_.entry->fqn, data_.file->path(), offset);
  }

  // The whole chunk, checked against the chunk's checksum.
  int64_t read_whole(bool verify_only) {
    if (read_.verified) {  // checked already: only the copy is left
      copy(out_, 0, location_.length);
      return 0;
    }
    const HashState state = new_hash_state();
    for (int64_t done = 0; done < location_.length; done += kChecksumBlockBytes) {
      const int64_t piece = std::min(kChecksumBlockBytes, location_.length - done);
      if (verify_only) {
        if (!guarded_hash_update(state.get(), chunk_bytes_ + done, static_cast<size_t>(piece))) throw_unreadable();
      } else {
        // Hash what was copied, while it is in cache: the buffer gets exactly the bytes
        // checked.
        copy(out_ + done, done, piece);
        XXH3_64bits_update(state.get(), out_ + done, static_cast<size_t>(piece));
      }
    }
    check_checksum(0, location_.length, XXH3_64bits_digest(state.get()), location_.checksum);
    read_.verified = true;
    return location_.length;
  }

  // Part of the chunk: its runs, and the checksum blocks they touch, each verified.
  // Without block checksums (version 1, or a chunk of one block) the chunk is one block.
  int64_t read_region(bool verify_only) {
    const std::vector<ByteRun> runs = runs_of(read_.chunk->box.sizes, region_, element_bytes_);
    int64_t checked = 0;
    if (!read_.verified) {
      const bool blocked = !location_.block_checksums.empty();
      const int64_t block_bytes = blocked ? kChecksumBlockBytes : location_.length;
      int64_t next_block = 0;  // blocks below it are verified
      for (const ByteRun& run : runs) {
        const int64_t first = std::max(next_block, run.begin / block_bytes);
        const int64_t last = (run.begin + run.length - 1) / block_bytes;
        for (int64_t block = first; block <= last; ++block) {
          const int64_t begin = block * block_bytes;
          const int64_t length = std::min(block_bytes, location_.length - begin);
          verify_block(begin, length,
                       blocked ? location_.block_checksums[static_cast<size_t>(block)] : location_.checksum);
          checked += length;
        }
        next_block = std::max(next_block, last + 1);
      }
      read_.verified = true;
      if (verify_only) return checked;
    }
    int64_t out_offset = 0;
    for (const ByteRun& run : runs) {
      copy(out_ + out_offset, run.begin, run.length);
      out_offset += run.length;
    }
    return checked;
  }

  const std::string& checkpoint_;
  ChunkRead& read_;
  const MappedDataFile& data_;
  const StorageLocation& location_;
  const int64_t element_bytes_;
  const ChunkBox region_;
  int64_t wanted_ = 0;                 // the region's bytes
  const char* chunk_bytes_ = nullptr;  // the chunk's first byte in the mapping
  char* out_ = nullptr;                // the buffer's first byte
};

}  // namespace

int64_t read_chunk(const std::string& checkpoint, ChunkRead& read, const MappedDataFile& data, bool verify_only) {
  return ChunkReader(checkpoint, read, data).run(verify_only);
}

}  // namespace stowage::dcp::detail
