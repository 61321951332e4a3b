#include "dcp/format/metadata_codec.h"

#include <stowage/dcp/metadata.h>

#include <nlohmann/json.hpp>

#include <sstream>

namespace stowage::dcp {
namespace {

using nlohmann::json;

json describe_chunk(const TensorChunk& chunk, bool checksummed) {
  return {{"offsets", chunk.box.offsets},
          {"sizes", chunk.box.sizes},
          {"rank", chunk.rank},
          {"file", chunk.location.file},
          {"offset", chunk.location.offset},
          {"length", chunk.location.length},
          {"checksum", checksummed ? detail::hex64(chunk.location.checksum) : "-"}};
}

json describe_entry(const EntryMetadata& entry, bool checksummed) {
  json row{{"key", entry.fqn}};
  if (entry.kind != EntryKind::kTensor) {
    std::ostringstream value;
    value << entry.value;
    row["value"] = value.str();
    return row;
  }
  row["dtype"] = detail::dtype_name(entry.dtype);
  row["shape"] = entry.shape;
  row["bytes"] = tensor_bytes(entry);
  json chunks = json::array();
  for (const TensorChunk& chunk : entry.chunks) chunks.push_back(describe_chunk(chunk, checksummed));
  row["chunks"] = std::move(chunks);
  return row;
}

}  // namespace

std::string describe_metadata(const Metadata& metadata, bool checksummed) {
  json entries = json::array();
  for (const EntryMetadata& entry : metadata.entries) entries.push_back(describe_entry(entry, checksummed));
  return json{{"save_id", metadata.save_id},
              {"ranks", metadata.world_size},
              {"version", metadata.version},
              {"entries", std::move(entries)}}
      .dump();
}

}  // namespace stowage::dcp
