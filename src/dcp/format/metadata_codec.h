#pragma once

// What the metadata's layouts share (docs/FORMAT.md): the object layout of versions 1
// and 2 (object_layout.cpp) and the table layout of version 3 (metadata.cpp) name dtypes
// and write hashes alike, and decode through one Decoder, whose every accessor checks
// presence and type and says where a problem is.

#include <stowage/dcp/metadata.h>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// The name a dtype is stored by ("Float"), and its hashes' form: 16 hex digits.
std::string dtype_name(c10::ScalarType dtype);
std::string hex64(uint64_t value);

// The metadata's own checksum (versions 2 and 3; optional in 1): XXH3-64 of the compact
// JSON of the document without this field. Hashing the parsed document, not the file's
// bytes, keeps it independent of layout; it catches what validation cannot, such as a
// changed value or offset.
inline constexpr const char* kChecksumField = "metadata_xxh3";
uint64_t document_checksum(const nlohmann::json& document);

struct Decoder {
  const std::string& origin;  // the metadata file, which every failure names
  std::string entry = "";     // the entry every failure names, when one is decoded alone

  // Metadata that does not say what a checkpoint's must is corrupt: CorruptionError.
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  // `problem` names where it is (as the shape checks' do).
  [[noreturn]] void corrupt(const std::string& problem, const std::string& entry_name) const;

  const nlohmann::json& field(const nlohmann::json& object, const char* key, const std::string& where) const;
  int64_t integer(const nlohmann::json& object, const char* key, const std::string& where) const;
  int64_t non_negative(const nlohmann::json& object, const char* key, const std::string& where) const;
  std::string string(const nlohmann::json& object, const char* key, const std::string& where) const;
  std::vector<int64_t> int_list(const nlohmann::json& object, const char* key, const std::string& where) const;
  c10::ScalarType dtype(const std::string& name, const std::string& where) const;
  ObjectPath path(const nlohmann::json& object, const std::string& where) const;
  c10::IValue scalar(const nlohmann::json& v, const std::string& where) const;
  c10::IValue value(const nlohmann::json& v, const std::string& where) const;

  // A hash stored as 16 hex digits, in `field`.
  uint64_t hash(const nlohmann::json& text, const char* field, const std::string& where) const;
  // A data file's name: a plain name inside the checkpoint directory.
  void check_file_name(const std::string& name, const std::string& where) const;
  // The block checksums of a chunk of `length` bytes: one per block when it spans several.
  std::vector<uint64_t> block_checksums(const nlohmann::json& hashes, int64_t length, const std::string& where) const;
  // The chunks tile the tensor and each is as long as its box: the checks of every version.
  void check_chunks(const EntryMetadata& entry, const std::string& where) const;
};

// Versions 1 and 2: an object per entry and per chunk (object_layout.cpp).
EntryMetadata decode_object_entry(const Decoder& d, const nlohmann::json& e, size_t i, int64_t version);
// The JSON text of `metadata` in that layout, as version `version` (1 or 2) wrote it: what a
// checkpoint of an older build holds. REQUIRES: version is 1 or 2.
std::string encode_object_layout(const Metadata& metadata, int64_t version);

}  // namespace stowage::dcp::detail
