#include "dcp/file_io.h"
#include "dcp/hash_state.h"
#include "dcp/internal.h"
#include "dcp/mapped_file.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace stowage::dcp {
namespace {

// Reads fan out over threads only when there is enough to read.
constexpr int64_t kBytesPerReadThread = int64_t(64) << 20;

}  // namespace

struct FileSystemReader::OpenFile {
  std::unique_ptr<ReadableFile> file;
  int64_t size = 0;  // when read_metadata() opened it
  // Its first `size` bytes, mapped by the first read that needs them.
  std::unique_ptr<MappedRegion> mapping;
};

namespace {

// Every chunk's byte range lies inside its file, and no two non-empty ranges of a file
// overlap. Then no load allocates more than the files hold, whatever sizes the
// metadata claims: the buffers load makes are as large as the chunks.
void check_chunk_ranges(const std::string& path, const Metadata& metadata,
                        const std::unordered_map<std::string, int64_t>& file_sizes) {
  struct Range {
    int64_t offset;
    int64_t end;
    const std::string* fqn;
  };
  std::unordered_map<std::string, std::vector<Range>> ranges;
  for (const EntryMetadata& entry : metadata.entries) {
    for (const TensorChunk& chunk : entry.chunks) {
      const StorageLocation& location = chunk.location;
      if (location.length == 0) continue;  // reads nothing; may sit past the file's end
      const int64_t size = file_sizes.at(location.file);
      if (location.offset > size || location.length > size - location.offset) {
        throw CorruptionError(
            fmt::format("checkpoint '{}': entry '{}': data file '{}' is truncated: it has {} bytes, the chunk needs "
                        "bytes {} to {}",
                        path, entry.fqn, location.file, size, location.offset, location.offset + location.length),
            entry.fqn, detail::join_path(path, location.file), size);
      }
      ranges[location.file].push_back(Range{location.offset, location.offset + location.length, &entry.fqn});
    }
  }
  for (auto& [file, list] : ranges) {
    std::sort(list.begin(), list.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i].offset < list[i - 1].end) {
        throw CorruptionError(
            fmt::format("checkpoint '{}': entries '{}' and '{}': their chunks overlap in data file "
                        "'{}' (bytes {} and {})",
                        path, *list[i - 1].fqn, *list[i].fqn, file, list[i - 1].offset, list[i].offset),
            *list[i].fqn, detail::join_path(path, file), list[i].offset);
      }
    }
  }
}

}  // namespace

FileSystemReader::FileSystemReader(std::string path, Env* env) : path_(std::move(path)), env_(env) {
  if (path_.empty()) throw InvalidArgument("FileSystemReader: the checkpoint path is empty");
  if (env_ == nullptr) throw InvalidArgument("FileSystemReader: the env is null");
}

FileSystemReader::~FileSystemReader() = default;

Metadata FileSystemReader::read_metadata() {
  bytes_checked_ = 0;
  const std::string metadata_path = detail::join_path(path_, kMetadataFileName);
  // A writer may replace the checkpoint between reading its metadata and opening its
  // files (it deletes the old files after committing); reading again then sees the new
  // one. A file missing under unchanged metadata is an error. Once open, files stay
  // readable whatever happens to their names.
  constexpr int kMaxAttempts = 100;
  for (int attempt = 1;; ++attempt) {
    if (!detail::file_exists(*env_, metadata_path)) {
      throw IoError(fmt::format("'{}' holds no checkpoint: its metadata file {} is missing", path_, kMetadataFileName),
                    metadata_path, "open", ENOENT);
    }
    Metadata metadata = decode_metadata(detail::read_text_file(*env_, metadata_path), metadata_path);
    const auto first_user = [&](const std::string& name) -> std::string {
      for (const EntryMetadata& entry : metadata.entries) {
        for (const TensorChunk& chunk : entry.chunks) {
          if (chunk.location.file == name) return entry.fqn;
        }
      }
      return {};
    };
    std::unordered_map<std::string, std::shared_ptr<OpenFile>> files;
    std::string missing;
    for (const std::string& name : metadata.files()) {
      const std::string file_path = detail::join_path(path_, name);
      auto open = std::make_shared<OpenFile>();
      try {
        open->file = env_->open_for_reading(file_path);
        open->size = open->file->size();
      } catch (const Error&) {
        // Gone, possibly between listing and opening: the checkpoint may have been replaced.
        if (!detail::file_exists(*env_, file_path)) {
          missing = name;
          break;
        }
        detail::rethrow_in_context(
            fmt::format("checkpoint '{}': entry '{}': data file '{}': ", path_, first_user(name), name),
            first_user(name));
      }
      files.emplace(name, std::move(open));
    }
    if (missing.empty()) {
      std::unordered_map<std::string, int64_t> file_sizes;
      for (const auto& [name, open] : files) file_sizes.emplace(name, open->size);
      check_chunk_ranges(path_, metadata, file_sizes);
      files_ = std::move(files);
      return metadata;
    }
    const bool replaced =
        detail::file_exists(*env_, metadata_path) &&
        decode_metadata(detail::read_text_file(*env_, metadata_path), metadata_path).save_id != metadata.save_id;
    if (replaced && attempt < kMaxAttempts) continue;
    throw CorruptionError(
        fmt::format("checkpoint '{}': entry '{}': its data file '{}' is missing", path_, first_user(missing), missing),
        first_user(missing), detail::join_path(path_, missing));
  }
}

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

}  // namespace

void FileSystemReader::read_data(std::vector<ChunkRead>& reads) {
  run_reads(reads, /*verify_only=*/false);
}

bool FileSystemReader::verify_data(std::vector<ChunkRead>& reads) {
  run_reads(reads, /*verify_only=*/true);
  return true;
}

void FileSystemReader::run_reads(std::vector<ChunkRead>& reads, bool verify_only) {
  // Map every file a read needs before the threads start. Mapping re-checks each
  // file's size, so a file truncated since read_metadata() fails here, by name.
  int64_t total = 0;
  for (const ChunkRead& read : reads) {
    total += static_cast<int64_t>(read.buffer.nbytes());
    const StorageLocation& location = read.chunk->location;
    const auto it = files_.find(location.file);
    if (it == files_.end()) {
      throw InvalidArgument(fmt::format("checkpoint '{}': entry '{}': data file '{}' was not opened by read_metadata()",
                                        path_, read.entry->fqn, location.file));
    }
    OpenFile& open = *it->second;
    if (location.length > 0 && !open.mapping) {
      try {
        open.mapping = open.file->map(open.size);
      } catch (const Error&) {
        detail::rethrow_in_context(fmt::format("checkpoint '{}': entry '{}': ", path_, read.entry->fqn),
                                   read.entry->fqn);
      }
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> bytes_checked{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;

  const auto read_one = [&](ChunkRead& read) {
    const StorageLocation& location = read.chunk->location;
    const auto where = [&] {
      return fmt::format("checkpoint '{}': entry '{}': data file '{}'", path_, read.entry->fqn, location.file);
    };
    const OpenFile& open = *files_.at(location.file);
    // The mapping covers the file's first open.size bytes: nothing outside them is read.
    if (location.offset < 0 || location.length < 0 || location.offset > open.size ||
        location.length > open.size - location.offset) {
      throw CorruptionError(fmt::format("{} is truncated: it has {} bytes, the chunk needs bytes {} to {}", where(),
                                        open.size, location.offset, location.offset + location.length),
                            read.entry->fqn, open.file->path(), open.size);
    }
    const int64_t element_bytes = element_size(read.entry->dtype);
    const ChunkBox region =
        read.region.value_or(ChunkBox{std::vector<int64_t>(read.chunk->box.sizes.size(), 0), read.chunk->box.sizes});
    const int64_t wanted = detail::checked_volume(region.sizes, read.entry->fqn) * element_bytes;
    if (read.buffer.nbytes() != static_cast<size_t>(wanted) || !read.buffer.is_contiguous() ||
        !read.buffer.device().is_cpu() || region.offsets.size() != read.chunk->box.sizes.size() ||
        region.sizes.size() != read.chunk->box.sizes.size()) {
      throw InvalidArgument(where() + ": the read buffer does not match the region read");
    }
    // Every run lies inside the chunk, and the chunk inside its bytes.
    const std::vector<int64_t>& chunk_sizes = read.chunk->box.sizes;
    for (size_t d = 0; d < chunk_sizes.size(); ++d) {
      if (region.offsets[d] < 0 || region.sizes[d] < 0 || region.offsets[d] > chunk_sizes[d] ||
          region.sizes[d] > chunk_sizes[d] - region.offsets[d]) {
        throw InvalidArgument(where() + ": the region read is not inside the chunk");
      }
    }
    if (detail::checked_volume(chunk_sizes, read.entry->fqn) * element_bytes != location.length) {
      throw CorruptionError(where() + ": the chunk's length does not match its shape", read.entry->fqn,
                            open.file->path(), location.offset);
    }
    if (location.length == 0) {
      read.verified = true;
      return;
    }
    // The chunk's bytes in the mapping; every range below lies inside them.
    const char* chunk_bytes = open.mapping->data() + location.offset;
    char* out = static_cast<char*>(read.buffer.data_ptr());
    // A guarded read of the mapping faulted: the file shrank, or the device could not
    // read a page (the kernel signals an I/O error on a mapped file the same way).
    const auto throw_unreadable = [&] {
      const int64_t size_now = open.file->size();
      if (size_now < open.size) {
        throw CorruptionError(fmt::format("{} was truncated while being read: it has {} bytes now", where(), size_now),
                              read.entry->fqn, open.file->path(), size_now);
      }
      throw IoError(fmt::format("{}: cannot read '{}': Input/output error (a page of its mapping could not be read)",
                                where(), open.file->path()),
                    open.file->path(), "read", EIO);
    };
    const auto corrupt = [&](int64_t offset, int64_t length, uint64_t actual, uint64_t expected) {
      return CorruptionError(
          fmt::format("{} is corrupt: the bytes at offset {} ({} bytes) have checksum {:016x}, expected {:016x}",
                      where(), offset, length, actual, expected),
          read.entry->fqn, open.file->path(), offset);
    };
    const auto copy = [&](char* destination, int64_t chunk_offset, int64_t length) {
      if (!detail::guarded_copy(destination, chunk_bytes + chunk_offset, static_cast<size_t>(length)))
        throw_unreadable();
    };
    if (wanted == location.length) {
      // The whole chunk, checked against the chunk's checksum.
      if (read.verified) {  // checked already: only the copy is left
        copy(out, 0, location.length);
        return;
      }
      const detail::HashState state = detail::new_hash_state();
      for (int64_t done = 0; done < location.length; done += kChecksumBlockBytes) {
        const int64_t piece = std::min(kChecksumBlockBytes, location.length - done);
        if (verify_only) {
          if (!detail::guarded_hash_update(state.get(), chunk_bytes + done, static_cast<size_t>(piece))) {
            throw_unreadable();
          }
        } else {
          // Hash what was copied, while it is in cache: the buffer gets exactly the
          // bytes checked.
          copy(out + done, done, piece);
          XXH3_64bits_update(state.get(), out + done, static_cast<size_t>(piece));
        }
      }
      const uint64_t checksum = XXH3_64bits_digest(state.get());
      bytes_checked += location.length;
      if (checksum != location.checksum) throw corrupt(location.offset, location.length, checksum, location.checksum);
      read.verified = true;
      return;
    }
    // Part of the chunk: its runs, and the checksum blocks they touch, each verified.
    // Without block checksums (version 1, or a chunk of one block) the chunk is one
    // block.
    const std::vector<ByteRun> runs = runs_of(read.chunk->box.sizes, region, element_bytes);
    if (!read.verified) {
      const bool blocked = !location.block_checksums.empty();
      const int64_t block_bytes = blocked ? kChecksumBlockBytes : location.length;
      int64_t next_block = 0;  // blocks below it are verified
      for (const ByteRun& run : runs) {
        const int64_t first = std::max(next_block, run.begin / block_bytes);
        const int64_t last = (run.begin + run.length - 1) / block_bytes;
        for (int64_t block = first; block <= last; ++block) {
          const int64_t begin = block * block_bytes;
          const int64_t length = std::min(block_bytes, location.length - begin);
          const detail::HashState state = detail::new_hash_state();
          if (!detail::guarded_hash_update(state.get(), chunk_bytes + begin, static_cast<size_t>(length))) {
            throw_unreadable();
          }
          const uint64_t checksum = XXH3_64bits_digest(state.get());
          const uint64_t expected = blocked ? location.block_checksums[static_cast<size_t>(block)] : location.checksum;
          if (checksum != expected) throw corrupt(location.offset + begin, length, checksum, expected);
          bytes_checked += length;
        }
        next_block = std::max(next_block, last + 1);
      }
      read.verified = true;
      if (verify_only) return;
    }
    int64_t out_offset = 0;
    for (const ByteRun& run : runs) {
      copy(out + out_offset, run.begin, run.length);
      out_offset += run.length;
    }
  };
  const auto worker = [&] {
    for (size_t i = next++; i < reads.size() && !failed.load(); i = next++) {
      try {
        read_one(reads[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  };
  const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({hardware, reads.size(), size_t(total / kBytesPerReadThread) + 1, 8});
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(worker);
  worker();
  for (std::thread& helper : helpers) helper.join();
  bytes_checked_ += bytes_checked.load();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace stowage::dcp
