#include "dcp/format/checks.h"
#include "dcp/storage/file_io.h"
#include "interop/torch_dcp_metadata.h"
#include "interop/torch_save_archive.h"
#include "util/error_context.h"

#include <stowage/error.h>
#include <stowage/interop/torch_dcp_reader.h>

#include <fmt/format.h>

#include <cerrno>

namespace stowage::dcp {
namespace {

// A larger `.metadata` is refused before it is read (DCP writes about 300 bytes a chunk).
constexpr int64_t kMaxTorchDcpMetadataBytes = int64_t(256) << 20;

// The whole `.metadata`, refused by its size first.
std::string read_torch_dcp_metadata(Env& env, const std::string& path) {
  const std::unique_ptr<ReadableFile> file = env.open_for_reading(path);
  const int64_t size = file->size();
  if (size > kMaxTorchDcpMetadataBytes) {
    throw CorruptionError(fmt::format("DCP metadata '{}': it has {} bytes, more than the {} this reader accepts", path,
                                      size, kMaxTorchDcpMetadataBytes),
                          "", path);
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  file->read_at(bytes.data(), size, 0);
  return bytes;
}

}  // namespace

struct TorchDcpReader::OpenFile {
  std::unique_ptr<ReadableFile> file;
  int64_t size = 0;  // when read_metadata() opened it
};

TorchDcpReader::TorchDcpReader(std::string path, Env* env) : path_(std::move(path)), env_(env) {
  if (path_.empty()) throw InvalidArgument("TorchDcpReader: the checkpoint path is empty");
  if (env_ == nullptr) throw InvalidArgument("TorchDcpReader: the env is null");
}

TorchDcpReader::~TorchDcpReader() = default;

const TorchDcpReader::OpenFile& TorchDcpReader::file_for(const std::string& fqn, const std::string& name) const {
  const auto it = files_.find(name);
  if (it == files_.end()) {
    throw InvalidArgument(
        fmt::format("DCP checkpoint '{}': entry '{}': data file '{}' was not opened by "
                    "read_metadata()",
                    path_, fqn, name));
  }
  return *it->second;
}

Metadata TorchDcpReader::read_metadata() {
  files_.clear();
  const std::string metadata_path = detail::join_path(path_, kTorchDcpMetadataFileName);
  if (!detail::file_exists(*env_, metadata_path)) {
    throw NotFound(fmt::format("'{}' holds no PyTorch DCP checkpoint: its metadata file {} is missing", path_,
                               kTorchDcpMetadataFileName),
                   metadata_path, "open", ENOENT);
  }
  detail::TorchDcpMetadata decoded =
      detail::decode_torch_dcp_metadata(read_torch_dcp_metadata(*env_, metadata_path), metadata_path);
  Metadata& metadata = decoded.metadata;

  // Every location lies inside its file, and a tensor's archive is at least as long as
  // the chunk's bytes, so that nothing a load allocates exceeds what the files hold.
  std::unordered_map<std::string, std::unique_ptr<OpenFile>> files;
  const auto check_location = [&](const std::string& fqn, const StorageLocation& location, int64_t payload) {
    auto& open = files[location.file];
    const std::string file_path = detail::join_path(path_, location.file);
    if (!open) {
      open = std::make_unique<OpenFile>();
      if (!detail::file_exists(*env_, file_path)) {
        throw CorruptionError(
            fmt::format("DCP checkpoint '{}': entry '{}': its data file '{}' is missing", path_, fqn, location.file),
            fqn, file_path);
      }
      try {
        open->file = env_->open_for_reading(file_path);
        open->size = open->file->size();
      } catch (const Error&) {
        util::rethrow_in_context(fmt::format("DCP checkpoint '{}': entry '{}': ", path_, fqn), fqn);
      }
    }
    if (location.offset > open->size || location.length > open->size - location.offset) {
      throw CorruptionError(
          fmt::format("DCP checkpoint '{}': entry '{}': data file '{}' has {} bytes, the item "
                      "needs bytes {} to {}",
                      path_, fqn, location.file, open->size, location.offset, location.offset + location.length),
          fqn, file_path, location.offset);
    }
    if (location.length < payload) {
      throw CorruptionError(fmt::format("DCP checkpoint '{}': entry '{}': its item in '{}' at offset {} has {} bytes, "
                                        "fewer than the {} its tensor needs",
                                        path_, fqn, location.file, location.offset, location.length, payload),
                            fqn, file_path, location.offset);
    }
  };
  for (const EntryMetadata& entry : metadata.entries) {
    for (const TensorChunk& chunk : entry.chunks) {
      const detail::CheckedCount payload =
          detail::count_bytes(chunk.box.sizes, entry.dtype, fmt::format("entry '{}'", entry.fqn));
      if (!payload.ok()) {
        throw CorruptionError(fmt::format("DCP checkpoint '{}': its chunk in '{}' at offset {}: {}", path_,
                                          chunk.location.file, chunk.location.offset, payload.problem),
                              entry.fqn, detail::join_path(path_, chunk.location.file), chunk.location.offset);
      }
      check_location(entry.fqn, chunk.location, payload.value);
    }
  }
  for (const detail::TorchDcpValueItem& item : decoded.values) {
    check_location(metadata.entries[item.entry].fqn, item.location, 0);
  }
  const std::string context = fmt::format("DCP checkpoint '{}'", path_);
  for (const detail::TorchDcpValueItem& item : decoded.values) {
    EntryMetadata& entry = metadata.entries[item.entry];
    const OpenFile& open = *files.at(item.location.file);
    entry.value = detail::TorchSaveArchive(*open.file, item.location.offset, item.location.length, entry.fqn, context)
                      .read_value();
  }
  files_ = std::move(files);
  return std::move(metadata);
}

void TorchDcpReader::read_data(std::vector<ChunkRead>& reads) {
  const std::string context = fmt::format("DCP checkpoint '{}'", path_);
  for (ChunkRead& read : reads) {
    const EntryMetadata& entry = *read.entry;
    const TensorChunk& chunk = *read.chunk;
    const ChunkBox region =
        read.region.value_or(ChunkBox{std::vector<int64_t>(chunk.box.sizes.size(), 0), chunk.box.sizes});
    bool fits = region.offsets.size() == chunk.box.sizes.size() && region.sizes.size() == chunk.box.sizes.size();
    for (size_t d = 0; fits && d < region.sizes.size(); ++d) {
      fits = region.offsets[d] >= 0 && region.sizes[d] >= 0 && region.offsets[d] <= chunk.box.sizes[d] &&
             region.sizes[d] <= chunk.box.sizes[d] - region.offsets[d];
    }
    int64_t region_bytes = -1;
    if (fits) {
      const detail::CheckedCount bytes = detail::count_bytes(region.sizes, entry.dtype, entry.fqn);
      fits = bytes.ok();  // always, for a region inside a chunk read_metadata() checked
      region_bytes = bytes.value;
    }
    const at::Tensor& buffer = read.buffer;
    if (!fits || !buffer.defined() || !buffer.device().is_cpu() || !buffer.is_contiguous() ||
        buffer.nbytes() != static_cast<size_t>(region_bytes)) {
      throw InvalidArgument(
          fmt::format("{}: entry '{}': the read buffer or region does not match the chunk", context, entry.fqn));
    }
    const OpenFile& open = file_for(entry.fqn, chunk.location.file);
    detail::TorchSaveArchive(*open.file, chunk.location.offset, chunk.location.length, entry.fqn, context)
        .read_tensor(entry.dtype, chunk.box.sizes, region, buffer);
  }
}

}  // namespace stowage::dcp
