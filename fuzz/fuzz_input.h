#pragma once

// The reader fuzzer's input: a checkpoint directory packed into one byte string.
//   [u32 metadata length][metadata text][u32 length of a.data][a.data][b.data]
// Lengths are little-endian and clipped to what is there, so every input unpacks.

#include <cstdint>
#include <fstream>
#include <string>

namespace stowage::fuzz {

struct PackedCheckpoint {
  std::string metadata, a, b;
};

inline uint32_t take_length(const std::string& bytes, size_t& at) {
  uint32_t value = 0;
  for (int i = 0; i < 4 && at < bytes.size(); ++i, ++at) value |= uint32_t(uint8_t(bytes[at])) << (8 * i);
  return value;
}

inline PackedCheckpoint unpack(const std::string& bytes) {
  PackedCheckpoint out;
  size_t at = 0;
  const size_t metadata_length = std::min<size_t>(take_length(bytes, at), bytes.size() - at);
  out.metadata = bytes.substr(at, metadata_length);
  at += metadata_length;
  const size_t a_length = std::min<size_t>(take_length(bytes, at), bytes.size() - at);
  out.a = bytes.substr(at, a_length);
  out.b = bytes.substr(at + a_length);
  return out;
}

inline std::string pack(const PackedCheckpoint& checkpoint) {
  std::string out;
  const auto put_length = [&](size_t n) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  };
  put_length(checkpoint.metadata.size());
  out += checkpoint.metadata;
  put_length(checkpoint.a.size());
  out += checkpoint.a;
  out += checkpoint.b;
  return out;
}

// Writes `bytes` as the whole of the file at `path` (the seeds, a fuzzed checkpoint's files).
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace stowage::fuzz
