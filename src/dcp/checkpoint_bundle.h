#pragma once

// One committed checkpoint directory as one string of bytes, to send to another rank
// (the memory tier's replicas) and to write back there, under the same commit rule.
//
// Bytes: for each file, its name's length and name, its length and contents (lengths
// as 8-byte little-endian integers); the metadata file last. Only plain files directly in
// the directory: a checkpoint of stowage's format has nothing else.

#include <stowage/dcp/env.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

namespace stowage::dcp {

// The files of the committed checkpoint `path`, as a 1-D uint8 tensor (each byte read
// once, straight into it: a process group sends it as it is). Throws InvalidArgument when
// it is not committed or holds anything but plain files; IoError as the reads raise it.
at::Tensor pack_checkpoint(const std::string& path, Env& env);

// The bytes of a tensor pack_checkpoint made (or a process group received).
std::string_view bundle_bytes(const at::Tensor& bundle);

// Writes `bundle`'s files into `path` (replacing what is there): the data files first,
// then the metadata under a temporary name renamed into place, so that the checkpoint is
// committed only once whole. Throws CorruptionError naming `path` for a bundle that is
// truncated or has no metadata last (nothing is then committed), IoError as the writes
// raise it.
void unpack_checkpoint(std::string_view bundle, const std::string& path, Env& env);

}  // namespace stowage::dcp
