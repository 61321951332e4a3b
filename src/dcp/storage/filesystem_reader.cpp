#include "dcp/storage/chunk_reader.h"
#include "dcp/storage/file_io.h"
#include "dcp/storage/mapped_file.h"
#include "util/parallel_jobs.h"
#include "util/error_context.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <memory>
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
      throw NotFound(fmt::format("'{}' holds no checkpoint: its metadata file {} is missing", path_, kMetadataFileName),
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
        util::rethrow_in_context(
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
        util::rethrow_in_context(fmt::format("checkpoint '{}': entry '{}': ", path_, read.entry->fqn), read.entry->fqn);
      }
    }
  }
  std::atomic<int64_t> bytes_checked{0};
  const auto read_one = [&](size_t i, const std::atomic<bool>& /*failed*/) {
    ChunkRead& read = reads[i];
    const OpenFile& open = *files_.at(read.chunk->location.file);
    bytes_checked += detail::read_chunk(path_, read, {open.file.get(), open.size, open.mapping.get()}, verify_only);
  };
  const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({hardware, reads.size(), size_t(total / kBytesPerReadThread) + 1, 8});
  // What the reads checked counts, those of a failed run too.
  try {
    util::run_parallel_jobs(reads.size(), std::max<size_t>(threads, 1), read_one);
  } catch (...) {
    bytes_checked_ += bytes_checked.load();
    throw;
  }
  bytes_checked_ += bytes_checked.load();
}

}  // namespace stowage::dcp
