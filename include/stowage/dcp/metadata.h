#pragma once

// What a checkpoint holds, as recorded in its metadata file (docs/FORMAT.md): every
// entry of the flattened state dict, and for each tensor the chunks that together
// cover it and where each chunk's bytes lie. Shaped for many ranks from the start: a
// tensor saved by several ranks has one chunk per distinct piece, each in the file of
// the rank that wrote it.

#include <stowage/state/state_dict.h>

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace stowage::dcp {

// The version this build writes. Readers accept exactly the versions they know: 1 (no
// block checksums), 2 (one JSON object per entry and chunk) and 3 (a table layout:
// positional entries and chunks, a table of file names; docs/FORMAT.md).
inline constexpr int64_t kFormatVersion = 3;
inline constexpr int64_t kOldestReadableFormatVersion = 1;
// Name of the metadata file inside a checkpoint directory; its presence commits the
// checkpoint.
inline constexpr const char* kMetadataFileName = ".metadata.json";
// Every chunk's bytes start at a multiple of this many bytes within their file.
inline constexpr int64_t kChunkAlignment = 64;
// A chunk longer than this has a checksum for every block of this many bytes (the last
// one shorter), so that a load reading part of it verifies what it reads by reading
// whole blocks rather than the whole chunk.
inline constexpr int64_t kChecksumBlockBytes = int64_t(256) << 10;

// A box of a tensor: where it starts in every dimension, and its extent.
struct ChunkBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  bool operator==(const ChunkBox& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

// Where one chunk's bytes are: a file directly inside the checkpoint directory, and a
// byte range of it holding the chunk in row-major order, little-endian.
struct StorageLocation {
  std::string file;
  int64_t offset = 0;
  int64_t length = 0;
  uint64_t checksum = 0;  // XXH3-64 (seed 0) of the length bytes
  // XXH3-64 of each kChecksumBlockBytes block, when length exceeds one block (from
  // format version 2 on); empty otherwise.
  std::vector<uint64_t> block_checksums;
};

struct TensorChunk {
  ChunkBox box;
  StorageLocation location;
  int64_t rank = 0;  // the rank that wrote it
};

enum class EntryKind { kTensor, kValue };

// One leaf of the flattened state dict.
struct EntryMetadata {
  std::string fqn;
  ObjectPath path;  // the exact path; keys may contain dots
  EntryKind kind = EntryKind::kValue;
  // kTensor: the global tensor and its chunks, which tile it exactly.
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  std::vector<TensorChunk> chunks;
  // kValue: the value itself (int, double, bool, string, None, an empty container, or a
  // list of those); stored inline in the metadata.
  c10::IValue value;
};

struct Metadata {
  int64_t version = kFormatVersion;  // of the checkpoint it was decoded from
  std::string save_id;               // unique per save; data file names carry it
  int64_t world_size = 1;
  std::vector<EntryMetadata> entries;

  // Builds the fqn index; call after filling `entries`. Throws InvalidArgument on a
  // repeated fqn.
  void index();
  // nullptr when absent (needs index()).
  const EntryMetadata* find(const std::string& fqn) const;
  // Every data file the entries refer to, each once, in first-use order.
  std::vector<std::string> files() const;

 private:
  std::unordered_map<std::string, size_t> by_fqn_;
};

// JSON text of `metadata` in the format this build writes (kFormatVersion, whatever
// metadata.version says: that is the version a decoded checkpoint was read from).
// Throws InvalidArgument naming the entry for a key or string that is not valid UTF-8.
std::string encode_metadata(const Metadata& metadata);
// Parses and validates metadata text: a known version, every field present and of its
// type, known dtypes, chunk lengths matching their boxes, in-bounds chunks, safe file
// names (a plain name: no separators, not "." or ".."). Throws Error naming `origin`
// and the offending entry otherwise. Never executes anything.
Metadata decode_metadata(const std::string& text, const std::string& origin);

// A reader's view of `metadata` as JSON text, for tools and people: its save id, ranks,
// version, and each entry's key with its value, or its dtype, shape, bytes and chunks (box,
// the rank that wrote it, file, byte range, and checksum as 16 hex digits, or "-" unless
// `checksummed`: PyTorch DCP's checkpoints keep none). Not the stored format
// (encode_metadata), which no reader should parse from this.
std::string describe_metadata(const Metadata& metadata, bool checksummed);

// Whether `name` may name a data file: a single path component inside the directory.
bool is_safe_file_name(const std::string& name);

// Bytes of one element of `dtype`.
int64_t element_size(c10::ScalarType dtype);

// The bytes of `entry`'s tensor: its shape's volume times its element size (0 for a
// value). Throws Error naming the entry when a size is negative or the count overflows
// an int64_t (metadata whose chunks each fit may still describe such a tensor).
int64_t tensor_bytes(const EntryMetadata& entry);
// The bytes of every tensor of `metadata`, each checked so, and their sum too.
int64_t tensor_bytes(const Metadata& metadata);

}  // namespace stowage::dcp
