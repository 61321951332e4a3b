#include "dcp/format/checks.h"
#include "dcp/format/json_values.h"
#include "dcp/format/metadata_codec.h"

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace stowage::dcp {

using detail::Decoder;
using detail::document_checksum;
using detail::dtype_name;
using detail::hex64;
using detail::kChecksumField;

namespace {

using nlohmann::json;

// ------------------------------------------------------------------ encoding

json encode_scalar(const c10::IValue& value, const std::string& fqn) {
  if (value.isNone()) return json{{"t", "none"}};
  if (value.isBool()) return json{{"t", "bool"}, {"v", value.toBool()}};
  if (value.isInt()) return json{{"t", "int"}, {"v", value.toInt()}};
  if (value.isDouble()) {
    const double d = value.toDouble();
    if (std::isnan(d)) return json{{"t", "double"}, {"v", "nan"}};
    if (std::isinf(d)) return json{{"t", "double"}, {"v", d > 0 ? "inf" : "-inf"}};
    return json{{"t", "double"}, {"v", d}};
  }
  if (value.isString()) return json{{"t", "str"}, {"v", value.toStringRef()}};
  throw InvalidArgument(
      fmt::format("checkpoint entry '{}' holds a {}, which a checkpoint cannot store", fqn, value.tagKind()));
}

json encode_value(const c10::IValue& value, const std::string& fqn) {
  if (value.isGenericDict()) {
    if (value.toGenericDict().size() != 0) {
      throw InvalidArgument(fmt::format("checkpoint entry '{}' is a non-empty dict, not a leaf", fqn));
    }
    return json{{"t", "dict"}};
  }
  if (value.isList()) {
    const auto list = value.toList();
    const c10::TypePtr& type = list.elementType();
    const char* elem = type->kind() == c10::TypeKind::IntType      ? "int"
                       : type->kind() == c10::TypeKind::FloatType  ? "double"
                       : type->kind() == c10::TypeKind::BoolType   ? "bool"
                       : type->kind() == c10::TypeKind::StringType ? "str"
                                                                   : "any";
    json items = json::array();
    // By index: the list's iterator yields proxies, which gcc 12 and 14 each warn about.
    for (size_t i = 0; i < list.size(); ++i) {
      items.push_back(encode_scalar(list.get(i), fqn));
    }
    return json{{"t", "list"}, {"elem", elem}, {"v", std::move(items)}};
  }
  return encode_scalar(value, fqn);
}

}  // namespace

namespace detail {

nlohmann::json encode_path(const ObjectPath& path) {
  nlohmann::json out = nlohmann::json::array();
  for (const PathElement& element : path) {
    if (const auto* key = std::get_if<std::string>(&element)) {
      out.push_back(*key);
    } else {
      out.push_back(std::get<int64_t>(element));
    }
  }
  return out;
}

nlohmann::json encode_value(const c10::IValue& value, const std::string& fqn) {
  return ::stowage::dcp::encode_value(value, fqn);
}

c10::IValue decode_value(const nlohmann::json& value, const std::string& origin, const std::string& where,
                         const std::string& entry) {
  return Decoder{origin, entry}.value(value, where);
}

}  // namespace detail

int64_t element_size(c10::ScalarType dtype) {
  return static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t tensor_bytes(const EntryMetadata& entry) {
  if (entry.kind != EntryKind::kTensor) return 0;
  return detail::checked_bytes(entry.shape, entry.dtype, fmt::format("checkpoint entry '{}'", entry.fqn));
}

int64_t tensor_bytes(const Metadata& metadata) {
  int64_t total = 0;
  for (const EntryMetadata& entry : metadata.entries) {
    const int64_t bytes = tensor_bytes(entry);
    if (bytes > std::numeric_limits<int64_t>::max() - total) {
      throw Error(
          fmt::format("checkpoint entry '{}': the tensors up to it hold more bytes than an int64_t counts", entry.fqn));
    }
    total += bytes;
  }
  return total;
}

bool is_safe_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void Metadata::index() {
  by_fqn_.clear();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!by_fqn_.emplace(entries[i].fqn, i).second) {
      throw InvalidArgument(fmt::format("checkpoint metadata lists entry '{}' twice", entries[i].fqn));
    }
  }
}

const EntryMetadata* Metadata::find(const std::string& fqn) const {
  const auto it = by_fqn_.find(fqn);
  return it == by_fqn_.end() ? nullptr : &entries[it->second];
}

std::vector<std::string> Metadata::files() const {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const EntryMetadata& entry : entries) {
    for (const TensorChunk& chunk : entry.chunks) {
      if (seen.insert(chunk.location.file).second) out.push_back(chunk.location.file);
    }
  }
  return out;
}

namespace {

// ------------------------------------------------------- version 3: tables
//
// An entry is ["t", name, dtype, shape, chunks] or ["v", name, value]; a chunk is
// [file index, offset, xxh3, rank, block xxh3s] for the whole tensor, with its offsets
// and sizes appended for a part. The name is the fqn when the path is its keys split at
// the dots, else the path itself. A chunk's length is its box's bytes.

// Whether `path` is `fqn` split at its dots: keys only, none empty (path_to_string
// drops an empty key's place) and none holding a dot.
bool path_is_dotted_name(const ObjectPath& path) {
  return std::all_of(path.begin(), path.end(), [](const PathElement& element) {
    const auto* key = std::get_if<std::string>(&element);
    return key != nullptr && !key->empty() && key->find('.') == std::string::npos;
  });
}

json encode_name(const EntryMetadata& entry) {
  return path_is_dotted_name(entry.path) ? json(entry.fqn) : detail::encode_path(entry.path);
}

json encode_chunk(const TensorChunk& chunk, const std::vector<int64_t>& shape, size_t file_index) {
  json blocks = json::array();
  for (uint64_t block : chunk.location.block_checksums) blocks.push_back(hex64(block));
  json out =
      json::array({file_index, chunk.location.offset, hex64(chunk.location.checksum), chunk.rank, std::move(blocks)});
  const bool whole = chunk.box.sizes == shape && std::all_of(chunk.box.offsets.begin(), chunk.box.offsets.end(),
                                                             [](int64_t offset) { return offset == 0; });
  if (!whole) {
    out.push_back(chunk.box.offsets);
    out.push_back(chunk.box.sizes);
  }
  return out;
}

// The header fields every version has, of the version written.
json encode_header(const Metadata& metadata) {
  return json{{"format", "stowage.dcp"},
              {"version", kFormatVersion},
              {"save_id", metadata.save_id},
              {"world_size", metadata.world_size},
              {"byte_order", "little"},
              {"alignment", kChunkAlignment},
              {"checksum_block_bytes", kChecksumBlockBytes}};
}

// The document's text: the header on the first line, then one entry a line.
std::string layout_text(json document) {
  json entries = std::move(document["entries"]);
  document.erase("entries");
  std::string text = document.dump();
  text.pop_back();  // the closing brace
  text += ",\"entries\":[";
  for (size_t i = 0; i < entries.size(); ++i) {
    text += i == 0 ? "\n" : ",\n";
    text += entries[i].dump();
  }
  text += "\n]}\n";
  return text;
}

}  // namespace

std::string encode_metadata(const Metadata& metadata) {
  std::vector<std::string> files = metadata.files();
  std::unordered_map<std::string, size_t> file_index;
  for (size_t i = 0; i < files.size(); ++i) file_index.emplace(files[i], i);
  json entries = json::array();
  for (const EntryMetadata& entry : metadata.entries) {
    if (entry.kind == EntryKind::kTensor) {
      json chunks = json::array();
      for (const TensorChunk& chunk : entry.chunks) {
        chunks.push_back(encode_chunk(chunk, entry.shape, file_index.at(chunk.location.file)));
      }
      entries.push_back(
          json::array({"t", encode_name(entry), dtype_name(entry.dtype), entry.shape, std::move(chunks)}));
    } else {
      entries.push_back(json::array({"v", encode_name(entry), encode_value(entry.value, entry.fqn)}));
    }
  }
  json document = encode_header(metadata);
  document["files"] = std::move(files);
  document["entries"] = std::move(entries);
  try {
    document[kChecksumField] = hex64(document_checksum(document));
    return layout_text(std::move(document));
  } catch (const json::type_error& e) {
    // The only failure dump() has: a string that is not UTF-8. Find whose.
    for (const EntryMetadata& entry : metadata.entries) {
      try {
        json{{"fqn", entry.fqn}}.dump();
      } catch (const json::type_error&) {
        throw InvalidArgument(fmt::format("checkpoint entry '{}': its name is not valid UTF-8", entry.fqn));
      }
    }
    throw InvalidArgument(fmt::format("checkpoint metadata holds a string that is not valid UTF-8 ({})", e.what()));
  }
}

namespace {

// ---------------------------------------------------------- version 3: tables

// The element `index` of the positional array `row`.
const json& element(const Decoder& d, const json& row, size_t index, const char* what, const std::string& where) {
  if (index >= row.size()) d.fail(where, fmt::format("missing its {}", what));
  return row[index];
}

int64_t non_negative_element(const Decoder& d, const json& row, size_t index, const char* what,
                             const std::string& where) {
  const json& v = element(d, row, index, what, where);
  if (!v.is_number_integer()) d.fail(where, fmt::format("its {} must be an integer", what));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    d.fail(where, fmt::format("its {} is out of range", what));
  }
  if (v.get<int64_t>() < 0) d.fail(where, fmt::format("its {} must not be negative", what));
  return v.get<int64_t>();
}

std::vector<int64_t> int_list_element(const Decoder& d, const json& row, size_t index, const char* what,
                                      const std::string& where) {
  return d.int_list(json{{what, element(d, row, index, what, where)}}, what, where);
}

EntryMetadata decode_table_entry(const Decoder& d, const json& row, size_t i, const std::vector<std::string>& files) {
  EntryMetadata entry;
  const std::string position = fmt::format("entry {}", i);
  if (!row.is_array() || row.empty() || !row[0].is_string()) d.fail(position, "expected a list starting with its kind");
  const json& name = element(d, row, 1, "name", position);
  if (name.is_string()) {
    entry.fqn = name.get<std::string>();
    size_t begin = 0;
    for (size_t dot = entry.fqn.find('.');; dot = entry.fqn.find('.', begin)) {
      entry.path.emplace_back(entry.fqn.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
  } else {
    entry.path = d.path(json{{"path", name}}, position);
    entry.fqn = path_to_string(entry.path);
  }
  const std::string where = fmt::format("entry '{}'", entry.fqn);
  const std::string kind = row[0].get<std::string>();
  if (kind == "v") {
    entry.kind = EntryKind::kValue;
    entry.value = d.value(element(d, row, 2, "value", where), where);
    return entry;
  }
  if (kind != "t") d.fail(where, fmt::format("unknown kind '{}'", kind));
  entry.kind = EntryKind::kTensor;
  const json& dtype = element(d, row, 2, "dtype", where);
  if (!dtype.is_string()) d.fail(where, "its dtype must be a string");
  entry.dtype = d.dtype(dtype.get<std::string>(), where);
  entry.shape = int_list_element(d, row, 3, "shape", where);
  const json& chunks = element(d, row, 4, "chunks", where);
  if (!chunks.is_array()) d.fail(where, "its chunks must be a list");
  for (const json& c : chunks) {
    if (!c.is_array() || (c.size() != 5 && c.size() != 7)) d.fail(where, "a chunk must be a list of 5 or 7 fields");
    TensorChunk chunk;
    const int64_t file = non_negative_element(d, c, 0, "chunk's file index", where);
    if (static_cast<uint64_t>(file) >= files.size()) {
      d.fail(where, fmt::format("a chunk's file index {} is not below the {} files", file, files.size()));
    }
    chunk.location.file = files[file];
    d.check_file_name(chunk.location.file, where);
    chunk.location.offset = non_negative_element(d, c, 1, "chunk's offset", where);
    chunk.location.checksum = d.hash(c[2], "xxh3", where);
    chunk.rank = non_negative_element(d, c, 3, "chunk's rank", where);
    if (c.size() == 7) {
      chunk.box.offsets = int_list_element(d, c, 5, "offsets", where);
      chunk.box.sizes = int_list_element(d, c, 6, "sizes", where);
    } else {
      chunk.box = ChunkBox{std::vector<int64_t>(entry.shape.size(), 0), entry.shape};
    }
    // The length is the box's bytes; check_chunks below rejects what overflows.
    const detail::CheckedCount volume = detail::count_volume(chunk.box.sizes, where);
    if (!volume.ok()) d.corrupt(volume.problem, entry.fqn);
    if (volume.value > std::numeric_limits<int64_t>::max() / element_size(entry.dtype)) {
      d.fail(where, "a chunk's byte length overflows");
    }
    chunk.location.length = volume.value * element_size(entry.dtype);
    chunk.location.block_checksums = d.block_checksums(c[4], chunk.location.length, where);
    entry.chunks.push_back(std::move(chunk));
  }
  d.check_chunks(entry, where);
  return entry;
}

std::vector<std::string> decode_files(const Decoder& d, const json& document) {
  const json& list = d.field(document, "files", "header");
  if (!list.is_array()) d.fail("header", "field 'files' must be a list of file names");
  std::vector<std::string> files;
  for (const json& name : list) {
    if (!name.is_string()) d.fail("header", "field 'files' must be a list of file names");
    files.push_back(name.get<std::string>());
  }
  return files;
}

// The document's checksum field matches its content (throws CorruptionError if not).
void check_document_checksum(const Decoder& d, json document) {
  const std::string stored = d.string(document, kChecksumField, "header");
  document.erase(kChecksumField);
  const std::string computed = hex64(document_checksum(document));
  if (stored != computed) {
    d.fail("header",
           fmt::format("the metadata is corrupt: its checksum is {}, its content hashes to {}", stored, computed));
  }
}

}  // namespace

Metadata decode_metadata(const std::string& text, const std::string& origin) {
  const Decoder d{origin};
  json document;
  try {
    document = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e400
    throw CorruptionError(fmt::format("checkpoint metadata {} is not valid JSON: {}", origin, e.what()), "", origin);
  }
  if (!document.is_object() || d.string(document, "format", "header") != "stowage.dcp") {
    d.fail("header", "not a stowage.dcp checkpoint");
  }
  Metadata metadata;
  metadata.version = d.integer(document, "version", "header");
  if (metadata.version < kOldestReadableFormatVersion || metadata.version > kFormatVersion) {
    // Not CorruptionError: written by another version of stowage, whose checksum this
    // build cannot judge.
    throw Error(
        fmt::format("checkpoint metadata {}: header: format version {} is not supported (this build reads "
                    "versions {} to {})",
                    origin, metadata.version, kOldestReadableFormatVersion, kFormatVersion));
  }
  if (metadata.version >= 2 && d.integer(document, "checksum_block_bytes", "header") != kChecksumBlockBytes) {
    d.fail("header", fmt::format("checksum blocks must be {} bytes", kChecksumBlockBytes));
  }
  if (d.string(document, "byte_order", "header") != "little") d.fail("header", "only little-endian data is supported");
  metadata.save_id = d.string(document, "save_id", "header");
  metadata.world_size = d.non_negative(document, "world_size", "header");
  const std::vector<std::string> files = metadata.version >= 3 ? decode_files(d, document) : std::vector<std::string>();
  const json& entries = d.field(document, "entries", "header");
  if (!entries.is_array()) d.fail("header", "field 'entries' must be a list");
  metadata.entries.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    metadata.entries.push_back(metadata.version >= 3 ? decode_table_entry(d, entries[i], i, files)
                                                     : detail::decode_object_entry(d, entries[i], i, metadata.version));
  }
  try {
    metadata.index();
  } catch (const InvalidArgument& e) {
    d.fail("entries", e.what());
  }
  // Last, so that a malformed document gets the error that says what is wrong with it.
  // Version 1 predates the field: there it is checked only when present.
  if (metadata.version == 1 && !document.contains(kChecksumField)) return metadata;
  check_document_checksum(d, document);
  return metadata;
}

}  // namespace stowage::dcp
