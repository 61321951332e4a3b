#include "dcp/checkpoint_bundle.h"

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <fmt/format.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

namespace stowage::dcp {
namespace {
namespace fs = std::filesystem;

// Writes `length` at `out` as 8 little-endian bytes; returns the byte after them.
char* put_length(char* out, uint64_t length) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + 8;
}

// A file to pack: its name in the bundle, and the file open for reading.
struct PackedFile {
  std::string name;
  std::unique_ptr<ReadableFile> file;
  int64_t size = 0;
};

// Reads a bundle front to back; every read checks that the bytes are there.
class BundleCursor {
 public:
  BundleCursor(std::string_view bundle, std::string path) : bundle_(bundle), path_(std::move(path)) {}
  bool done() const { return offset_ == bundle_.size(); }
  std::string_view take(uint64_t length) {
    if (length > bundle_.size() - offset_) {
      throw CorruptionError(fmt::format("checkpoint bundle for {}: truncated at byte {} of {} (wanted {} more)", path_,
                                        offset_, bundle_.size(), length),
                            "", path_, static_cast<int64_t>(offset_));
    }
    const std::string_view bytes(bundle_.data() + offset_, length);
    offset_ += length;
    return bytes;
  }
  uint64_t take_length() {
    const std::string_view bytes = take(8);
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
    return length;
  }

 private:
  std::string_view bundle_;
  std::string path_;
  size_t offset_ = 0;
};

void write_file(const std::string& path, std::string_view bytes, Env& env) {
  const std::unique_ptr<WritableFile> file = env.create_file(path);
  if (!bytes.empty()) file->write_at(bytes.data(), static_cast<int64_t>(bytes.size()), 0);
  file->close();
}

}  // namespace

at::Tensor pack_checkpoint(const std::string& path, Env& env) {
  const std::string metadata = (fs::path(path) / kMetadataFileName).string();
  if (env.file_type(metadata) != FileType::kRegular) {
    throw InvalidArgument(
        fmt::format("pack_checkpoint: {} is not a committed checkpoint (no {})", path, kMetadataFileName));
  }
  std::vector<PackedFile> files;
  for (const std::string& name : env.list_directory(path)) {
    if (name == kMetadataFileName) continue;
    const std::string file = (fs::path(path) / name).string();
    if (env.file_type(file) != FileType::kRegular) {
      throw InvalidArgument(
          fmt::format("pack_checkpoint: {} is {}, not a checkpoint's file", file, describe(env.file_type(file))));
    }
    files.push_back({name, env.open_for_reading(file)});
  }
  files.push_back({kMetadataFileName, env.open_for_reading(metadata)});  // last: its arrival commits the copy
  int64_t total = 0;
  for (PackedFile& each : files) {
    each.size = each.file->size();
    total += 16 + static_cast<int64_t>(each.name.size()) + each.size;
  }
  at::Tensor bundle = at::empty({total}, at::kByte);
  char* out = static_cast<char*>(bundle.data_ptr());
  for (const PackedFile& each : files) {
    out = put_length(out, each.name.size());
    out = std::copy(each.name.begin(), each.name.end(), out);
    out = put_length(out, static_cast<uint64_t>(each.size));
    if (each.size > 0) each.file->read_at(out, each.size, 0);
    out += each.size;
  }
  return bundle;
}

std::string_view bundle_bytes(const at::Tensor& bundle) {
  return {static_cast<const char*>(bundle.data_ptr()), static_cast<size_t>(bundle.numel())};
}

void unpack_checkpoint(std::string_view bundle, const std::string& path, Env& env) {
  std::vector<std::pair<std::string, std::string_view>> files;
  BundleCursor cursor(bundle, path);
  while (!cursor.done()) {
    std::string name(cursor.take(cursor.take_length()));
    const std::string_view bytes = cursor.take(cursor.take_length());
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw CorruptionError(fmt::format("checkpoint bundle for {}: a file named '{}'", path, name), "", path);
    }
    files.emplace_back(std::move(name), bytes);
  }
  if (files.empty() || files.back().first != kMetadataFileName) {
    throw CorruptionError(fmt::format("checkpoint bundle for {}: its last file is not {}", path, kMetadataFileName), "",
                          path);
  }
  remove_checkpoint(path, env);
  env.create_directories(path);
  for (size_t i = 0; i + 1 < files.size(); ++i)
    write_file((fs::path(path) / files[i].first).string(), files[i].second, env);
  const std::string metadata = (fs::path(path) / kMetadataFileName).string();
  write_file(metadata + ".partial", files.back().second, env);
  env.rename_file(metadata + ".partial", metadata);
}

}  // namespace stowage::dcp
