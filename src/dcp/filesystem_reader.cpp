#include "dcp/file_io.h"
#include "dcp/internal.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <xxhash.h>

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
