#include "interop/safetensors_header.h"

#include "dcp/format/checks.h"

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <utility>

namespace stowage::dcp::detail {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

// The dtypes both a checkpoint and safetensors hold, and their codes, in the order of
// safetensors' own Dtype enum (which its writer sorts by).
constexpr std::array<std::pair<c10::ScalarType, const char*>, 11> kCodes = {{{c10::kBool, "BOOL"},
                                                                             {c10::kByte, "U8"},
                                                                             {c10::kChar, "I8"},
                                                                             {c10::kShort, "I16"},
                                                                             {c10::kHalf, "F16"},
                                                                             {c10::kBFloat16, "BF16"},
                                                                             {c10::kInt, "I32"},
                                                                             {c10::kFloat, "F32"},
                                                                             {c10::kComplexFloat, "C64"},
                                                                             {c10::kDouble, "F64"},
                                                                             {c10::kLong, "I64"}}};

size_t rank_of(c10::ScalarType dtype) {
  for (size_t i = 0; i < kCodes.size(); ++i) {
    if (kCodes[i].first == dtype) return i;
  }
  return kCodes.size();
}

// Codes safetensors defines that no checkpoint dtype matches.
constexpr std::array<const char*, 11> kCodesWithoutDtype = {
    "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2"};

// A JSON parse that refuses a name repeated within one object, which nlohmann would
// silently resolve to its last occurrence.
json parse_without_repeated_names(const std::string& text, const std::string& file) {
  std::vector<std::set<std::string>> names;
  return json::parse(text, [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) names.emplace_back();
    if (event == json::parse_event_t::object_end) names.pop_back();
    if (event == json::parse_event_t::key && !names.back().insert(parsed.get<std::string>()).second) {
      throw CorruptionError(
          fmt::format("safetensors file '{}': the header names '{}' twice", file, parsed.get<std::string>()), "", file,
          8);
    }
    return true;
  });
}

c10::ScalarType dtype_of_code(const std::string& code, const std::string& file, const std::string& name) {
  for (const auto& [dtype, known] : kCodes) {
    if (code == known) return dtype;
  }
  if (std::find(kCodesWithoutDtype.begin(), kCodesWithoutDtype.end(), code) != kCodesWithoutDtype.end()) {
    throw InvalidArgument(fmt::format("safetensors file '{}': tensor '{}' has dtype {}, which a checkpoint cannot hold",
                                      file, name, code));
  }
  throw CorruptionError(fmt::format("safetensors file '{}': tensor '{}' has the unknown dtype '{}'", file, name, code),
                        name, file, 8);
}

std::vector<int64_t> non_negative_integers(const json& list, size_t count, const char* field, const std::string& file,
                                           const std::string& name) {
  const bool fits =
      list.is_array() && (count == 0 || list.size() == count) &&
      std::all_of(list.begin(), list.end(), [](const json& v) {
        return v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
      });
  if (!fits) {
    throw CorruptionError(
        fmt::format("safetensors file '{}': tensor '{}' has a malformed '{}': {}", file, name, field, list.dump()),
        name, file, 8);
  }
  return list.get<std::vector<int64_t>>();
}

SafetensorsTensor decode_tensor(const std::string& name, const json& info, const std::string& file) {
  if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() || !info.contains("shape") ||
      !info.contains("data_offsets")) {
    throw CorruptionError(
        fmt::format("safetensors file '{}': tensor '{}' needs a dtype, a shape and data_offsets", file, name), name,
        file, 8);
  }
  SafetensorsTensor tensor;
  tensor.name = name;
  tensor.dtype = dtype_of_code(info["dtype"].get<std::string>(), file, name);
  tensor.shape = non_negative_integers(info["shape"], 0, "shape", file, name);
  const std::vector<int64_t> range = non_negative_integers(info["data_offsets"], 2, "data_offsets", file, name);
  tensor.begin = range[0];
  tensor.end = range[1];
  const std::string what = fmt::format("safetensors file '{}': tensor '{}'", file, name);
  const CheckedCount bytes = count_bytes(tensor.shape, tensor.dtype, what);
  if (!bytes.ok()) throw CorruptionError(bytes.problem, name, file, 8);
  if (tensor.end < tensor.begin || tensor.end - tensor.begin != bytes.value) {
    throw CorruptionError(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, its dtype and shape {}", what,
                                      tensor.begin, tensor.end, tensor.end - tensor.begin, bytes.value),
                          name, file, 8);
  }
  return tensor;
}

// The ranges, sorted, must follow one another from 0 to the end of the file.
void check_ranges_tile_the_data(std::vector<SafetensorsTensor>& tensors, int64_t data_bytes, const std::string& file) {
  std::sort(tensors.begin(), tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  int64_t expected = 0;
  for (const SafetensorsTensor& tensor : tensors) {
    if (tensor.begin != expected) {
      throw CorruptionError(
          fmt::format("safetensors file '{}': tensor '{}' starts at data byte {}, expected {}: {}", file, tensor.name,
                      tensor.begin, expected, tensor.begin > expected ? "a gap" : "it overlaps the tensor before"),
          tensor.name, file, 8);
    }
    expected = tensor.end;
  }
  if (expected != data_bytes) {
    throw CorruptionError(fmt::format("safetensors file '{}': the tensors hold {} bytes of data, the file {}", file,
                                      expected, data_bytes),
                          "", file, 8);
  }
}

}  // namespace

std::string safetensors_dtype_code(c10::ScalarType dtype, const std::string& entry) {
  for (const auto& [known, code] : kCodes) {
    if (dtype == known) return code;
  }
  throw InvalidArgument(
      fmt::format("entry '{}' is a {} tensor, which safetensors cannot hold", entry, c10::toString(dtype)));
}

bool written_before(const SafetensorsTensor& a, const SafetensorsTensor& b) {
  const size_t rank_a = rank_of(a.dtype), rank_b = rank_of(b.dtype);
  return rank_a != rank_b ? rank_a > rank_b : a.name < b.name;
}

std::string encode_safetensors_header(std::vector<SafetensorsTensor>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  ordered_json header = ordered_json::object();
  header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (SafetensorsTensor& tensor : tensors) {
    tensor.begin = offset;
    tensor.end = offset + checked_bytes(tensor.shape, tensor.dtype, tensor.name);
    offset = tensor.end;
    header[tensor.name] = {{"dtype", safetensors_dtype_code(tensor.dtype, tensor.name)},
                           {"shape", tensor.shape},
                           {"data_offsets", {tensor.begin, tensor.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return bytes + text;
}

SafetensorsHeader decode_safetensors_header(const ReadableFile& file) {
  const std::string& path = file.path();
  const int64_t file_size = file.size();
  if (file_size < 8) {
    throw CorruptionError(
        fmt::format("safetensors file '{}' has {} bytes, fewer than its header's length", path, file_size), "", path,
        0);
  }
  unsigned char length_bytes[8];
  file.read_at(length_bytes, 8, 0);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  if (length > uint64_t(std::min(kMaxSafetensorsHeaderBytes, file_size - 8))) {
    throw CorruptionError(fmt::format("safetensors file '{}': a header of {} bytes does not fit the file of {} bytes "
                                      "(or the limit of {})",
                                      path, length, file_size, kMaxSafetensorsHeaderBytes),
                          "", path, 0);
  }
  std::string text(length, '\0');
  file.read_at(text.data(), static_cast<int64_t>(length), 8);
  json document;
  try {
    document = parse_without_repeated_names(text, path);
  } catch (const json::exception& e) {
    throw CorruptionError(fmt::format("safetensors file '{}': the header is not JSON: {}", path, e.what()), "", path,
                          8);
  }
  if (!document.is_object()) {
    throw CorruptionError(fmt::format("safetensors file '{}': the header is not a JSON object", path), "", path, 8);
  }
  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(length);
  header.file_size = file_size;
  for (const auto& [name, info] : document.items()) {
    if (name != "__metadata__") {
      header.tensors.push_back(decode_tensor(name, info, path));
      continue;
    }
    const bool strings =
        info.is_object() && std::all_of(info.begin(), info.end(), [](const json& v) { return v.is_string(); });
    if (!strings) {
      throw CorruptionError(fmt::format("safetensors file '{}': __metadata__ is not a map of strings", path), "", path,
                            8);
    }
    header.metadata = info.get<std::map<std::string, std::string>>();
  }
  check_ranges_tile_the_data(header.tensors, file_size - header.data_start, path);
  return header;
}

}  // namespace stowage::dcp::detail
