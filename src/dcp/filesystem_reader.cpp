#include "dcp/file_io.h"
#include "dcp/internal.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
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
      if (!detail::file_exists(file_path)) {
        missing = name;
        break;
      }
      auto open = std::make_shared<OpenFile>();
      try {
        open->file = detail::File::open_for_reading(file_path);
        open->size = open->file.size();
      } catch (const Error& e) {
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

void FileSystemReader::read_data(std::vector<ChunkRead>& reads) {
  int64_t total = 0;
  for (const ChunkRead& read : reads) total += read.chunk->location.length;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
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
    if (read.buffer.nbytes() != static_cast<size_t>(location.length) || !read.buffer.is_contiguous()) {
      throw InvalidArgument(where() + ": the read buffer does not match the chunk");
    }
    char* bytes = static_cast<char*>(read.buffer.data_ptr());
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    try {
      for (int64_t done = 0; done < location.length; done += kPieceBytes) {
        const int64_t piece = std::min(kPieceBytes, location.length - done);
        open.file.read_at(bytes + done, piece, location.offset + done);
        XXH3_64bits_update(state, bytes + done, static_cast<size_t>(piece));
      }
    } catch (const Error& e) {
      XXH3_freeState(state);
      throw Error(fmt::format("{}: {}", where(), e.what()));
    }
    const uint64_t checksum = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    if (checksum != location.checksum) {
      throw Error(fmt::format("{} is corrupt: the chunk at offset {} ({} bytes) has checksum {:016x}, expected {:016x}",
                              where(), location.offset, location.length, checksum, location.checksum));
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
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace stowage::dcp
