// export_safetensors: a checkpoint's tensors, one at a time, into safetensors shards.
#include <stowage/interop/safetensors.h>

#include "dcp/format/checks.h"
#include "dcp/format/json_values.h"
#include "dcp/storage/file_io.h"
#include "interop/safetensors_header.h"
#include "util/strings.h"

#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>

namespace stowage::dcp {
namespace {

using detail::SafetensorsTensor;
namespace fs = std::filesystem;

constexpr const char* kSuffix = ".safetensors";

struct Shard {
  std::string path;
  std::vector<const EntryMetadata*> entries;
  int64_t bytes = 0;
};

// Hugging Face's greedy split: entries in order, a new shard whenever the next tensor
// would overflow a shard that holds something already.
std::vector<Shard> plan_shards(const std::vector<const EntryMetadata*>& tensors, const std::string& out,
                               int64_t max_shard_bytes) {
  std::vector<Shard> shards(1);
  for (const EntryMetadata* entry : tensors) {
    const int64_t bytes = detail::checked_bytes(entry->shape, entry->dtype, entry->fqn);
    if (!shards.back().entries.empty() && shards.back().bytes + bytes > max_shard_bytes) shards.emplace_back();
    shards.back().entries.push_back(entry);
    shards.back().bytes += bytes;
  }
  if (shards.size() == 1) {
    shards[0].path = out;
    return shards;
  }
  const std::string stem = out.substr(0, out.size() - std::string(kSuffix).size());
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].path = fmt::format("{}-{:05d}-of-{:05d}{}", stem, i + 1, shards.size(), kSuffix);
  }
  return shards;
}

// The whole tensor of `entry`, read and verified chunk by chunk: one chunk is read
// straight into it, several each through a buffer of the chunk's size.
at::Tensor read_tensor(StorageReader& reader, const EntryMetadata& entry) {
  at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
  for (const TensorChunk& chunk : entry.chunks) {
    std::vector<ChunkRead> reads(1);
    reads[0].entry = &entry;
    reads[0].chunk = &chunk;
    reads[0].buffer = entry.chunks.size() == 1 ? tensor : at::empty(chunk.box.sizes, tensor.options());
    reader.read_data(reads);
    if (entry.chunks.size() == 1) break;
    at::Tensor box = tensor;
    for (size_t d = 0; d < chunk.box.sizes.size(); ++d) box = box.narrow(d, chunk.box.offsets[d], chunk.box.sizes[d]);
    box.copy_(reads[0].buffer);
  }
  return tensor;
}

// Writes one shard's header and tensors under `temporary`, synced.
void write_shard(StorageReader& reader, Env& env, const Shard& shard, const std::string& temporary,
                 const std::string& prefix, const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensor> layout;
  layout.reserve(shard.entries.size());
  for (const EntryMetadata* entry : shard.entries) {
    layout.push_back({entry->fqn.substr(prefix.size()), entry->dtype, entry->shape});
  }
  std::vector<size_t> order(layout.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return detail::written_before(layout[a], layout[b]); });
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(order.size());
  for (size_t i : order) ordered.push_back(layout[i]);
  const std::string header = detail::encode_safetensors_header(ordered, metadata);

  std::unique_ptr<WritableFile> file = env.create_file(temporary);
  file->write_at(header.data(), static_cast<int64_t>(header.size()), 0);
  const auto data_start = static_cast<int64_t>(header.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const at::Tensor tensor = read_tensor(reader, *shard.entries[order[i]]);
    file->write_at(tensor.data_ptr(), static_cast<int64_t>(tensor.nbytes()), data_start + ordered[i].begin);
    file->start_writeback(data_start + ordered[i].begin, static_cast<int64_t>(tensor.nbytes()));
  }
  file->sync();
  file->close();
}

std::string index_json(const std::vector<Shard>& shards, const std::string& prefix) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (const Shard& shard : shards) {
    total += shard.bytes;
    for (const EntryMetadata* entry : shard.entries) {
      weight_map[entry->fqn.substr(prefix.size())] = fs::path(shard.path).filename().string();
    }
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

// Files written under temporary names, renamed to their final names by commit(). A
// failure anywhere, commit's own renames and directory sync included, removes every file
// of the export under either name.
class PendingFiles {
 public:
  explicit PendingFiles(Env& env) : env_(env), suffix_(".tmp-" + detail::new_save_id()) {}
  PendingFiles(const PendingFiles&) = delete;
  PendingFiles& operator=(const PendingFiles&) = delete;
  ~PendingFiles() {
    for (const auto& file : files_) {
      remove_quietly(file.temporary);
      if (file.renamed) remove_quietly(file.final_path);
    }
  }

  std::string add(const std::string& final_path) {
    files_.push_back({final_path + suffix_, final_path});
    return files_.back().temporary;
  }

  void commit(const std::string& directory) {
    for (auto& file : files_) {
      env_.rename_file(file.temporary, file.final_path);
      file.renamed = true;
    }
    env_.sync_directory(directory);
    files_.clear();
  }

 private:
  struct File {
    std::string temporary;
    std::string final_path;
    bool renamed = false;
  };

  void remove_quietly(const std::string& path) {
    try {
      if (env_.file_type(path) != FileType::kAbsent) env_.remove_file(path);
    } catch (...) {
      // Best effort: the export already failed with the error that matters.
    }
  }

  Env& env_;
  std::string suffix_;
  std::vector<File> files_;
};

}  // namespace

SafetensorsExportResult export_safetensors(StorageReader& reader, const std::string& out,
                                           const SafetensorsExportOptions& options) {
  if (!util::ends_with(out, kSuffix) || fs::path(out).filename() == kSuffix) {
    throw InvalidArgument(fmt::format("the safetensors output '{}' must be a file name ending in '{}'", out, kSuffix));
  }
  if (options.max_shard_bytes() < 1) {
    throw InvalidArgument(fmt::format("max_shard_bytes must be at least 1, got {}", options.max_shard_bytes()));
  }
  Env& env = *options.env();
  const Metadata metadata = reader.read_metadata();
  const std::string& prefix = options.prefix();
  std::vector<const EntryMetadata*> tensors;
  nlohmann::json values = nlohmann::json::object();
  for (const EntryMetadata& entry : metadata.entries) {
    if (entry.fqn.compare(0, prefix.size(), prefix) != 0 || entry.fqn.size() == prefix.size()) continue;
    if (entry.kind == EntryKind::kValue) {
      values[entry.fqn.substr(prefix.size())] = detail::encode_value(entry.value, entry.fqn);
      continue;
    }
    detail::safetensors_dtype_code(entry.dtype, entry.fqn);  // refuses what safetensors cannot hold, before writing
    if (entry.fqn.substr(prefix.size()) == "__metadata__") {
      throw InvalidArgument(
          fmt::format("entry '{}' would be named __metadata__, which safetensors reserves", entry.fqn));
    }
    tensors.push_back(&entry);
  }
  if (tensors.empty() && values.empty()) {
    throw InvalidArgument(fmt::format("the checkpoint has no entry named '{}...' to export", prefix));
  }
  std::map<std::string, std::string> header_metadata{{"format", "pt"}};
  if (!values.empty()) header_metadata[detail::kSafetensorsValuesKey] = values.dump();

  const std::vector<Shard> shards = plan_shards(tensors, out, options.max_shard_bytes());
  SafetensorsExportResult result;
  for (const Shard& shard : shards) result.files.push_back(shard.path);
  if (shards.size() > 1) result.files.push_back(out + ".index.json");
  for (const std::string& path : result.files) {
    if (!options.overwrite() && env.file_type(path) != FileType::kAbsent) {
      throw InvalidArgument(fmt::format("'{}' exists and the option overwrite is off", path));
    }
    detail::refuse_special_file(env, path);
  }

  const std::string directory = fs::path(out).parent_path().empty() ? "." : fs::path(out).parent_path().string();
  env.create_directories(directory);
  PendingFiles pending(env);
  for (size_t i = 0; i < shards.size(); ++i) {
    // The values go with the first shard only: an import reads them once.
    write_shard(reader, env, shards[i], pending.add(shards[i].path), prefix,
                i == 0 ? header_metadata : std::map<std::string, std::string>{{"format", "pt"}});
    result.tensors += static_cast<int64_t>(shards[i].entries.size());
    result.tensor_bytes += shards[i].bytes;
  }
  if (shards.size() > 1) {
    const std::string text = index_json(shards, prefix);
    std::unique_ptr<WritableFile> index = env.create_file(pending.add(out + ".index.json"));
    index->write_at(text.data(), static_cast<int64_t>(text.size()), 0);
    index->sync();
    index->close();
  }
  pending.commit(directory);
  result.values = static_cast<int64_t>(values.size());
  return result;
}

}  // namespace stowage::dcp
