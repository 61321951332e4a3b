#pragma once

// The header of a safetensors file: a little-endian u64 N, then N bytes of JSON naming
// every tensor's dtype, shape and byte range within the data that follows. Encoded for
// export, decoded and validated for import, before any tensor byte is read.

#include <stowage/dcp/env.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace stowage::dcp::detail {

// Readers (safetensors' own among them) refuse a header longer than this.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// The __metadata__ key under which export puts a checkpoint's non-tensor values.
inline constexpr const char* kSafetensorsValuesKey = "stowage.values";

struct SafetensorsTensor {
  std::string name;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  // Its bytes, [begin, end) relative to the first byte after the header.
  int64_t begin = 0;
  int64_t end = 0;
};

struct SafetensorsHeader {
  // In data order: each starts where the one before ends, the first at 0.
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;  // __metadata__
  int64_t data_start = 0;                       // 8 + N: the file offset of data byte 0
  int64_t file_size = 0;                        // as validated: data_start + the tensors' bytes
};

// The safetensors code of `dtype` ("F32", "BF16", ...); InvalidArgument naming `entry`
// for a dtype safetensors has no code for (complex half, complex double).
std::string safetensors_dtype_code(c10::ScalarType dtype, const std::string& entry);

// The order safetensors' own writer puts tensors in: by dtype, the later in its Dtype
// enum first (the wider elements, roughly), then by name. With the header padded to 8
// bytes, every tensor then starts aligned to its element size, and a file stowage
// exports is byte for byte the one safetensors writes for the same tensors.
bool written_before(const SafetensorsTensor& a, const SafetensorsTensor& b);

// Lays `tensors` out in this order from data byte 0 (setting begin and end) and returns
// the header bytes: the length, then the JSON (__metadata__ first) padded with spaces to
// a multiple of 8 bytes, so that every tensor starts as aligned as the tensors before it
// leave it.
std::string encode_safetensors_header(std::vector<SafetensorsTensor>& tensors,
                                      const std::map<std::string, std::string>& metadata);

// Reads and validates the header of `file`: a length within the file and the limit, a
// JSON object with no repeated name, every entry with a known dtype, a shape of
// non-negative sizes and a byte range of exactly its size, the ranges tiling the data
// with no gap or overlap, and the data ending where the file ends. Throws
// CorruptionError naming the file (and the tensor) otherwise; InvalidArgument for a
// valid dtype a checkpoint cannot hold (U16, U32, U64, the 8-, 6- and 4-bit floats).
SafetensorsHeader decode_safetensors_header(const ReadableFile& file);

}  // namespace stowage::dcp::detail
