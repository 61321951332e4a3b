#include "dcp/format/metadata_codec.h"

#include "dcp/format/checks.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include "dcp/format/hash_state.h"

#include <array>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace stowage::dcp::detail {

using nlohmann::json;

namespace {

// The dtypes a checkpoint may hold: every dense type LibTorch 1.13 has.
constexpr std::array<c10::ScalarType, 13> kDtypes = {
    c10::kByte,   c10::kChar,        c10::kShort,        c10::kInt,           c10::kLong, c10::kHalf,    c10::kFloat,
    c10::kDouble, c10::kComplexHalf, c10::kComplexFloat, c10::kComplexDouble, c10::kBool, c10::kBFloat16};

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  return c10::toString(dtype);
}

std::string hex64(uint64_t value) {
  return fmt::format("{:016x}", value);
}

uint64_t document_checksum(const json& document) {
  const std::string compact = document.dump();
  return XXH3_64bits(compact.data(), compact.size());
}

void Decoder::fail(const std::string& where, const std::string& what) const {
  corrupt(fmt::format("{}: {}", where, what), entry);
}

void Decoder::corrupt(const std::string& problem, const std::string& entry_name) const {
  throw CorruptionError(fmt::format("checkpoint metadata {}: {}", origin, problem), entry_name, origin);
}

const json& Decoder::field(const json& object, const char* key, const std::string& where) const {
  if (!object.is_object()) fail(where, "expected an object");
  const auto it = object.find(key);
  if (it == object.end()) fail(where, fmt::format("missing field '{}'", key));
  return *it;
}

int64_t Decoder::integer(const json& object, const char* key, const std::string& where) const {
  const json& v = field(object, key, where);
  if (!v.is_number_integer()) fail(where, fmt::format("field '{}' must be an integer", key));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(where, fmt::format("field '{}' is out of range", key));
  }
  return v.get<int64_t>();
}

int64_t Decoder::non_negative(const json& object, const char* key, const std::string& where) const {
  const int64_t v = integer(object, key, where);
  if (v < 0) fail(where, fmt::format("field '{}' must not be negative", key));
  return v;
}

std::string Decoder::string(const json& object, const char* key, const std::string& where) const {
  const json& v = field(object, key, where);
  if (!v.is_string()) fail(where, fmt::format("field '{}' must be a string", key));
  return v.get<std::string>();
}

std::vector<int64_t> Decoder::int_list(const json& object, const char* key, const std::string& where) const {
  const json& v = field(object, key, where);
  if (!v.is_array()) fail(where, fmt::format("field '{}' must be a list of integers", key));
  std::vector<int64_t> out;
  for (const json& element : v) {
    if (!element.is_number_integer() ||
        (element.is_number_unsigned() && element.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))) {
      fail(where, fmt::format("field '{}' must be a list of integers", key));
    }
    out.push_back(element.get<int64_t>());
  }
  return out;
}

c10::ScalarType Decoder::dtype(const std::string& name, const std::string& where) const {
  for (c10::ScalarType candidate : kDtypes) {
    if (dtype_name(candidate) == name) return candidate;
  }
  fail(where, fmt::format("unknown dtype '{}'", name));
}

ObjectPath Decoder::path(const json& object, const std::string& where) const {
  const json& v = field(object, "path", where);
  if (!v.is_array() || v.empty()) fail(where, "field 'path' must be a non-empty list");
  ObjectPath out;
  for (const json& element : v) {
    if (element.is_string()) {
      out.emplace_back(element.get<std::string>());
    } else if (element.is_number_integer() && element.get<int64_t>() >= 0) {
      out.emplace_back(element.get<int64_t>());
    } else {
      fail(where, "field 'path' may hold only keys and list indices");
    }
  }
  if (!std::holds_alternative<std::string>(out.front())) fail(where, "field 'path' must start with a key");
  return out;
}

c10::IValue Decoder::scalar(const json& v, const std::string& where) const {
  const std::string type = string(v, "t", where);
  if (type == "none") return c10::IValue();
  const json& value = field(v, "v", where);
  if (type == "bool" && value.is_boolean()) return value.get<bool>();
  if (type == "int" && value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (type == "int" && value.is_number_unsigned() &&
      value.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())) {
    return value.get<int64_t>();
  }
  if (type == "double" && value.is_number()) return value.get<double>();
  if (type == "double" && value.is_string()) {
    const std::string s = value.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  if (type == "str" && value.is_string()) return value.get<std::string>();
  fail(where, fmt::format("malformed value of type '{}'", type));
}

c10::IValue Decoder::value(const json& v, const std::string& where) const {
  const std::string type = string(v, "t", where);
  if (type == "dict") return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
  if (type != "list") return scalar(v, where);
  const std::string elem = string(v, "elem", where);
  const json& items = field(v, "v", where);
  if (!items.is_array()) fail(where, "list value must hold a list");
  c10::TypePtr element_type = elem == "int"      ? c10::TypePtr(c10::IntType::get())
                              : elem == "double" ? c10::TypePtr(c10::FloatType::get())
                              : elem == "bool"   ? c10::TypePtr(c10::BoolType::get())
                              : elem == "str"    ? c10::TypePtr(c10::StringType::get())
                              : elem == "any"    ? c10::TypePtr(c10::AnyType::get())
                                                 : nullptr;
  if (!element_type) fail(where, fmt::format("unknown list element type '{}'", elem));
  c10::impl::GenericList list(element_type);
  for (const json& item : items) {
    c10::IValue element = scalar(item, where);
    if (elem != "any" && !element.type()->isSubtypeOf(*element_type)) {
      fail(where, fmt::format("list of {} holds a {}", elem, element.tagKind()));
    }
    list.push_back(std::move(element));
  }
  return list;
}

uint64_t Decoder::hash(const json& text, const char* field, const std::string& where) const {
  if (!text.is_string()) fail(where, fmt::format("field '{}' must hold 16 hex digits", field));
  const std::string digits = text.get<std::string>();
  char* end = nullptr;
  errno = 0;
  const uint64_t value = std::strtoull(digits.c_str(), &end, 16);
  if (digits.size() != 16 || errno != 0 || end != digits.c_str() + digits.size()) {
    fail(where, fmt::format("field '{}' must hold 16 hex digits", field));
  }
  return value;
}

void Decoder::check_file_name(const std::string& name, const std::string& where) const {
  if (!is_safe_file_name(name)) fail(where, fmt::format("file name '{}' would leave the checkpoint directory", name));
}

std::vector<uint64_t> Decoder::block_checksums(const json& hashes, int64_t length, const std::string& where) const {
  const int64_t blocks = (length + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  const size_t expected = blocks > 1 ? static_cast<size_t>(blocks) : 0;
  if (!hashes.is_array() || hashes.size() != expected) {
    fail(where, fmt::format("field 'block_xxh3' must list {} block checksums", expected));
  }
  std::vector<uint64_t> out;
  for (const json& hash_text : hashes) out.push_back(hash(hash_text, "block_xxh3", where));
  return out;
}

void Decoder::check_chunks(const EntryMetadata& entry, const std::string& where) const {
  std::vector<ChunkBox> boxes;
  for (const TensorChunk& chunk : entry.chunks) boxes.push_back(chunk.box);
  if (const std::string problem = detail::tiling_problem(entry.shape, boxes, where); !problem.empty()) {
    corrupt(problem, entry.fqn);
  }
  for (const TensorChunk& chunk : entry.chunks) {
    const detail::CheckedCount volume = detail::count_volume(chunk.box.sizes, where);
    if (!volume.ok()) corrupt(volume.problem, entry.fqn);
    if (volume.value > std::numeric_limits<int64_t>::max() / element_size(entry.dtype) ||
        chunk.location.length != volume.value * element_size(entry.dtype)) {
      fail(where, fmt::format("a chunk of {} elements of {} cannot be {} bytes", volume.value, dtype_name(entry.dtype),
                              chunk.location.length));
    }
    if (chunk.location.offset > std::numeric_limits<int64_t>::max() - chunk.location.length) {
      fail(where, "chunk byte range overflows");
    }
  }
}

}  // namespace stowage::dcp::detail
