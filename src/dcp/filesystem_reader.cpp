#include "dcp/file_io.h"
#include "dcp/internal.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <thread>


namespace stowage::dcp {
namespace {

constexpr int64_t kPieceBytes = int64_t(8) << 20;
// Reads fan out over threads only when there is enough to read.
constexpr int64_t kBytesPerReadThread = int64_t(64) << 20;

}  // namespace

struct FileSystemReader::OpenFile {
  detail::File file;
  int64_t size = 0;
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
        throw Error(fmt::format("checkpoint '{}': entry '{}': data file '{}' is truncated: it has {} bytes, the chunk "
                                "needs bytes {} to {}",
                                path, entry.fqn, location.file, size, location.offset, location.offset + location.length));
      }
      ranges[location.file].push_back(Range{location.offset, location.offset + location.length, &entry.fqn});
    }
  }
  for (auto& [file, list] : ranges) {
    std::sort(list.begin(), list.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i].offset < list[i - 1].end) {
        throw Error(fmt::format("checkpoint '{}': entries '{}' and '{}': their chunks overlap in data file '{}' "
                                "(bytes {} and {})",
                                path, *list[i - 1].fqn, *list[i].fqn, file, list[i - 1].offset, list[i].offset));
      }
    }
  }
}

}  // namespace

FileSystemReader::FileSystemReader(std::string path) : path_(std::move(path)) {
  if (path_.empty()) throw InvalidArgument("FileSystemReader: the checkpoint path is empty");
}

FileSystemReader::~FileSystemReader() = default;

Metadata FileSystemReader::read_metadata() {
  const std::string metadata_path = detail::join_path(path_, kMetadataFileName);
  // A writer may replace the checkpoint between reading its metadata and opening its
  // files (it deletes the old files after committing); reading again then sees the new
  // one. A file missing under unchanged metadata is an error. Once open, files stay
  // readable whatever happens to their names.
  constexpr int kMaxAttempts = 100;
  for (int attempt = 1;; ++attempt) {
    if (!detail::file_exists(metadata_path)) {
      throw Error(fmt::format("'{}' holds no checkpoint: its metadata file {} is missing", path_, kMetadataFileName));
    }
    Metadata metadata = decode_metadata(detail::read_text_file(metadata_path), metadata_path);
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
        open->file = detail::File::open_for_reading(file_path);
        open->size = open->file.size();
      } catch (const Error& e) {
        // Gone, possibly between listing and opening: the checkpoint may have been replaced.
        if (!detail::file_exists(file_path)) {
          missing = name;
          break;
        }
        throw Error(fmt::format("checkpoint '{}': entry '{}': data file '{}': {}", path_, first_user(name), name,
                                e.what()));
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
    const bool replaced = detail::file_exists(metadata_path) &&
                          decode_metadata(detail::read_text_file(metadata_path), metadata_path).save_id !=
                              metadata.save_id;
    if (replaced && attempt < kMaxAttempts) continue;
    throw Error(fmt::format("checkpoint '{}': entry '{}': its data file '{}' is missing", path_, first_user(missing),
                            missing));
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
  int64_t total = 0;
  for (const ChunkRead& read : reads) total += static_cast<int64_t>(read.buffer.nbytes());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> bytes_read{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;

  const auto read_one = [&](ChunkRead& read) {
    const StorageLocation& location = read.chunk->location;
    const auto where = [&] {
      return fmt::format("checkpoint '{}': entry '{}': data file '{}'", path_, read.entry->fqn, location.file);
    };
    const auto it = files_.find(location.file);
    if (it == files_.end()) throw Error(where() + " was not opened by read_metadata()");
    const OpenFile& open = *it->second;
    if (open.size < location.offset + location.length) {
      throw Error(fmt::format("{} is truncated: it has {} bytes, the chunk needs bytes {} to {}", where(), open.size,
                              location.offset, location.offset + location.length));
    }
    const int64_t element_bytes = element_size(read.entry->dtype);
    const ChunkBox region = read.region.value_or(
        ChunkBox{std::vector<int64_t>(read.chunk->box.sizes.size(), 0), read.chunk->box.sizes});
    const int64_t wanted = detail::checked_volume(region.sizes, read.entry->fqn) * element_bytes;
    if (read.buffer.nbytes() != static_cast<size_t>(wanted) || !read.buffer.is_contiguous() ||
        region.offsets.size() != read.chunk->box.sizes.size() || region.sizes.size() != read.chunk->box.sizes.size()) {
      throw InvalidArgument(where() + ": the read buffer does not match the region read");
    }
    char* out = static_cast<char*>(read.buffer.data_ptr());
    const auto corrupt = [&](int64_t offset, int64_t length, uint64_t actual, uint64_t expected) {
      return Error(fmt::format("{} is corrupt: the bytes at offset {} ({} bytes) have checksum {:016x}, expected {:016x}",
                               where(), offset, length, actual, expected));
    };
    try {
      if (wanted == location.length) {
        // The whole chunk: straight into the buffer, checked against the chunk's checksum.
        XXH3_state_t* state = XXH3_createState();
        XXH3_64bits_reset(state);
        try {
          for (int64_t done = 0; done < location.length; done += kPieceBytes) {
            const int64_t piece = std::min(kPieceBytes, location.length - done);
            open.file.read_at(out + done, piece, location.offset + done);
            XXH3_64bits_update(state, out + done, static_cast<size_t>(piece));
          }
        } catch (...) {
          XXH3_freeState(state);
          throw;
        }
        const uint64_t checksum = XXH3_64bits_digest(state);
        XXH3_freeState(state);
        bytes_read += location.length;
        if (checksum != location.checksum) throw corrupt(location.offset, location.length, checksum, location.checksum);
        return;
      }
      // Part of the chunk: the checksum blocks its runs touch, read and verified a
      // piece at a time into a scratch buffer, then the runs copied out. Without block
      // checksums (version 1, or a chunk of one block) the chunk is one block.
      const std::vector<ByteRun> runs = runs_of(read.chunk->box.sizes, region, element_bytes);
      const bool blocked = !location.block_checksums.empty();
      const int64_t block_bytes = blocked ? kChecksumBlockBytes : location.length;
      const auto block_hash = [&](int64_t block) {
        return blocked ? location.block_checksums[static_cast<size_t>(block)] : location.checksum;
      };
      const int64_t piece_blocks = std::max<int64_t>(1, kPieceBytes / block_bytes);
      std::vector<char> scratch;
      size_t run = 0;
      int64_t out_offset = 0;     // where runs[run] goes in the buffer
      int64_t run_done = 0;       // bytes of runs[run] already copied
      while (run < runs.size()) {
        // The next piece: from the block holding the next byte wanted, the following
        // blocks that runs touch, up to piece_blocks of them.
        const int64_t first_block = (runs[run].begin + run_done) / block_bytes;
        int64_t last_block = (runs[run].begin + runs[run].length - 1) / block_bytes;
        for (size_t r = run + 1; r < runs.size() && last_block - first_block + 1 < piece_blocks; ++r) {
          if (runs[r].begin / block_bytes > last_block + 1) break;
          last_block = std::max(last_block, (runs[r].begin + runs[r].length - 1) / block_bytes);
        }
        last_block = std::min(last_block, first_block + piece_blocks - 1);
        const int64_t piece_begin = first_block * block_bytes;
        const int64_t piece_end = std::min(location.length, (last_block + 1) * block_bytes);
        scratch.resize(static_cast<size_t>(piece_end - piece_begin));
        open.file.read_at(scratch.data(), piece_end - piece_begin, location.offset + piece_begin);
        bytes_read += piece_end - piece_begin;
        for (int64_t block_begin = piece_begin; block_begin < piece_end; block_begin += block_bytes) {
          const int64_t length = std::min(block_bytes, piece_end - block_begin);
          const uint64_t checksum = XXH3_64bits(scratch.data() + (block_begin - piece_begin), static_cast<size_t>(length));
          const uint64_t expected = block_hash(block_begin / block_bytes);
          if (checksum != expected) throw corrupt(location.offset + block_begin, length, checksum, expected);
        }
        // Copy what the piece holds of the runs; stop at the first byte beyond it.
        while (run < runs.size()) {
          const int64_t from = runs[run].begin + run_done;
          if (from >= piece_end) break;
          const int64_t n = std::min(runs[run].length - run_done, piece_end - from);
          std::memcpy(out + out_offset + run_done, scratch.data() + (from - piece_begin), static_cast<size_t>(n));
          run_done += n;
          if (run_done == runs[run].length) {
            out_offset += runs[run].length;
            run_done = 0;
            ++run;
          }
        }
      }
    } catch (const Error& e) {
      const std::string message = e.what();
      if (message.rfind(where(), 0) == 0) throw;
      throw Error(fmt::format("{}: {}", where(), message));
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
  bytes_read_ = bytes_read.load();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace stowage::dcp
