// The object layout of format versions 1 and 2 (docs/FORMAT.md): an object per entry and
// per chunk, each field by name. This build writes version 3; it reads these, and writes
// them only as an older build did, for the tests of what such a checkpoint holds.
#include "dcp/format/json_values.h"
#include "dcp/format/metadata_codec.h"

#include <stowage/error.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

namespace stowage::dcp::detail {

using nlohmann::json;

EntryMetadata decode_object_entry(const Decoder& d, const json& e, size_t i, int64_t version) {
  EntryMetadata entry;
  entry.fqn = d.string(e, "fqn", fmt::format("entry {}", i));
  const std::string where = fmt::format("entry '{}'", entry.fqn);
  entry.path = d.path(e, where);
  if (path_to_string(entry.path) != entry.fqn) d.fail(where, "its path does not match its name");
  const std::string kind = d.string(e, "kind", where);
  if (kind == "value") {
    entry.kind = EntryKind::kValue;
    entry.value = d.value(d.field(e, "value", where), where);
    return entry;
  }
  if (kind != "tensor") d.fail(where, fmt::format("unknown kind '{}'", kind));
  entry.kind = EntryKind::kTensor;
  entry.dtype = d.dtype(d.string(e, "dtype", where), where);
  entry.shape = d.int_list(e, "shape", where);
  const json& chunks = d.field(e, "chunks", where);
  if (!chunks.is_array()) d.fail(where, "field 'chunks' must be a list");
  for (const json& c : chunks) {
    TensorChunk chunk;
    chunk.box.offsets = d.int_list(c, "offsets", where);
    chunk.box.sizes = d.int_list(c, "sizes", where);
    chunk.rank = d.non_negative(c, "rank", where);
    chunk.location.file = d.string(c, "file", where);
    d.check_file_name(chunk.location.file, where);
    chunk.location.offset = d.non_negative(c, "offset", where);
    chunk.location.length = d.non_negative(c, "length", where);
    chunk.location.checksum = d.hash(d.field(c, "xxh3", where), "xxh3", where);
    const int64_t blocks = (chunk.location.length + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
    if (version >= 2 && blocks > 1) {
      chunk.location.block_checksums = d.block_checksums(d.field(c, "block_xxh3", where), chunk.location.length, where);
    }
    entry.chunks.push_back(std::move(chunk));
  }
  d.check_chunks(entry, where);
  return entry;
}

namespace {

json encode_object_chunk(const TensorChunk& chunk, int64_t version) {
  json out{
      {"offsets", chunk.box.offsets},          {"sizes", chunk.box.sizes},        {"rank", chunk.rank},
      {"file", chunk.location.file},           {"offset", chunk.location.offset}, {"length", chunk.location.length},
      {"xxh3", hex64(chunk.location.checksum)}};
  if (version >= 2 && !chunk.location.block_checksums.empty()) {
    json blocks = json::array();
    for (uint64_t block : chunk.location.block_checksums) blocks.push_back(hex64(block));
    out["block_xxh3"] = std::move(blocks);
  }
  return out;
}

json encode_object_entry(const EntryMetadata& entry, int64_t version) {
  json out{{"fqn", entry.fqn}, {"path", encode_path(entry.path)}};
  if (entry.kind == EntryKind::kValue) {
    out["kind"] = "value";
    out["value"] = encode_value(entry.value, entry.fqn);
    return out;
  }
  json chunks = json::array();
  for (const TensorChunk& chunk : entry.chunks) chunks.push_back(encode_object_chunk(chunk, version));
  out["kind"] = "tensor";
  out["dtype"] = dtype_name(entry.dtype);
  out["shape"] = entry.shape;
  out["chunks"] = std::move(chunks);
  return out;
}

}  // namespace

std::string encode_object_layout(const Metadata& metadata, int64_t version) {
  TORCH_INTERNAL_ASSERT(version == 1 || version == 2, "the object layout is versions 1 and 2, not ", version);
  json entries = json::array();
  for (const EntryMetadata& entry : metadata.entries) entries.push_back(encode_object_entry(entry, version));
  json document{{"format", "stowage.dcp"},           {"version", version},     {"save_id", metadata.save_id},
                {"world_size", metadata.world_size}, {"byte_order", "little"}, {"alignment", kChunkAlignment},
                {"entries", std::move(entries)}};
  if (version == 1) return document.dump();  // version 1 had no checksum of its own
  document["checksum_block_bytes"] = kChecksumBlockBytes;
  document[kChecksumField] = hex64(document_checksum(document));
  return document.dump();
}

}  // namespace stowage::dcp::detail
