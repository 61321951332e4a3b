// import_safetensors: safetensors files, validated whole, saved as a stowage checkpoint
// straight from read-only mappings of them.
#include <stowage/dcp/checkpoint.h>
#include <stowage/interop/safetensors.h>

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
#include <set>

namespace stowage::dcp {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// One safetensors file, open and validated; mapped once every file has been validated.
struct SourceFile {
  std::unique_ptr<ReadableFile> file;
  detail::SafetensorsHeader header;
  std::unique_ptr<MappedRegion> mapping;
};

// The index's weight map (tensor name to shard file name), each shard a plain name in
// the index's directory.
std::map<std::string, std::string> read_weight_map(Env& env, const std::string& index) {
  json document;
  try {
    document = json::parse(detail::read_text_file(env, index));
  } catch (const json::exception& e) {
    throw CorruptionError(fmt::format("safetensors index '{}' is not JSON: {}", index, e.what()), "", index);
  }
  if (!document.is_object() || !document.contains("weight_map") || !document["weight_map"].is_object()) {
    throw CorruptionError(fmt::format("safetensors index '{}' has no weight_map object", index), "", index);
  }
  if (document["weight_map"].empty()) {
    throw CorruptionError(fmt::format("safetensors index '{}' lists no tensor", index), "", index);
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, shard] : document["weight_map"].items()) {
    if (!shard.is_string() || !is_safe_file_name(shard.get<std::string>())) {
      throw CorruptionError(
          fmt::format("safetensors index '{}': tensor '{}' names the shard {}, not a file in the index's directory",
                      index, name, shard.dump()),
          name, index);
    }
    weight_map[name] = shard.get<std::string>();
  }
  return weight_map;
}

// Opens and validates every file of `source`; for an index, also that each tensor is in
// the shard the index names for it, and that every shard tensor is in the index.
std::vector<SourceFile> open_sources(Env& env, const std::string& source) {
  std::vector<SourceFile> sources;
  auto open = [&](const std::string& path) {
    SourceFile opened;
    opened.file = env.open_for_reading(path);
    opened.header = detail::decode_safetensors_header(*opened.file);
    sources.push_back(std::move(opened));
  };
  if (!util::ends_with(source, ".json")) {
    open(source);
    return sources;
  }
  const std::map<std::string, std::string> weight_map = read_weight_map(env, source);
  std::map<std::string, std::string> shard_of;  // what the shards hold
  const fs::path directory = fs::path(source).parent_path();
  std::set<std::string> opened;
  for (const auto& listed : weight_map) {
    const std::string& shard = listed.second;
    if (!opened.insert(shard).second) continue;
    open((directory / shard).string());
    for (const auto& tensor : sources.back().header.tensors) shard_of[tensor.name] = shard;
  }
  for (const auto& [name, shard] : shard_of) {
    const auto listed = weight_map.find(name);
    if (listed == weight_map.end() || listed->second != shard) {
      throw CorruptionError(
          fmt::format("safetensors index '{}': shard '{}' holds tensor '{}', which the index {}", source, shard, name,
                      listed == weight_map.end() ? "does not list" : "puts in " + listed->second),
          name, source);
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (shard_of.count(name) == 0) {
      throw CorruptionError(fmt::format("safetensors index '{}' puts tensor '{}' in shard '{}', which does not hold it",
                                        source, name, shard),
                            name, source);
    }
  }
  return sources;
}

// The tensors as views of the mapping (nothing is copied: the writer reads the mapped
// pages as it writes them) and the values in __metadata__.
void add_entries(SourceFile& source, StateDict& state, SafetensorsImportResult& result) {
  const std::string& path = source.file->path();
  // What was validated: a file that shrank since fails here, one that grew is read as it was.
  source.mapping = source.file->map(source.header.file_size);
  for (const detail::SafetensorsTensor& tensor : source.header.tensors) {
    if (state.contains(tensor.name)) {
      throw CorruptionError(
          fmt::format("safetensors file '{}' repeats tensor '{}' of another shard", path, tensor.name), tensor.name,
          path);
    }
    const auto options = at::TensorOptions().dtype(tensor.dtype);
    // The mapping is read-only and outlives the save; the tensor is only ever read.
    void* data = const_cast<char*>(source.mapping->data()) + source.header.data_start + tensor.begin;
    state.insert(tensor.name, tensor.end == tensor.begin ? at::empty(tensor.shape, options)
                                                         : at::from_blob(data, tensor.shape, options));
    ++result.tensors;
    result.tensor_bytes += tensor.end - tensor.begin;
  }
  const auto values = source.header.metadata.find(detail::kSafetensorsValuesKey);
  if (values == source.header.metadata.end()) return;
  json decoded;
  try {
    decoded = json::parse(values->second);
  } catch (const json::exception& e) {
    throw CorruptionError(fmt::format("safetensors file '{}': __metadata__ '{}' is not JSON: {}", path,
                                      detail::kSafetensorsValuesKey, e.what()),
                          "", path);
  }
  if (!decoded.is_object()) {
    throw CorruptionError(
        fmt::format("safetensors file '{}': __metadata__ '{}' is not an object", path, detail::kSafetensorsValuesKey),
        "", path);
  }
  for (const auto& [name, value] : decoded.items()) {
    if (state.contains(name)) {
      throw CorruptionError(fmt::format("safetensors file '{}' names '{}' as a tensor and as a value", path, name),
                            name, path);
    }
    state.insert(name, detail::decode_value(value, path, name, name));
    ++result.values;
  }
}

}  // namespace

SafetensorsImportResult import_safetensors(const std::string& source, const std::string& checkpoint_dir,
                                           const SafetensorsImportOptions& options) {
  std::vector<SourceFile> sources = open_sources(*options.env(), source);
  SafetensorsImportResult result;
  StateDict state;
  for (SourceFile& file : sources) {
    add_entries(file, state, result);
    result.files.push_back(file.file->path());
  }
  FileSystemWriter writer(checkpoint_dir, options.writer());
  save(state, writer);
  return result;
}

}  // namespace stowage::dcp
