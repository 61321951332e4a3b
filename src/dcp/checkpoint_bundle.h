#pragma once

// One committed checkpoint directory as one string of bytes, to send to another rank
// (the memory tier's replicas) and to write back there, under the same commit rule.
//
// Bytes: for each file, its name's length and name, its length and contents (lengths
// as 8-byte little-endian integers); the metadata file last. Only plain files directly in
// the directory: a checkpoint of stowage's format has nothing else.

#include <stowage/dcp/env.h>

#include <string>

namespace stowage::dcp {

// The files of the committed checkpoint `path`. Throws InvalidArgument when it is not
// committed or holds anything but plain files; IoError as the reads raise it.
std::string pack_checkpoint(const std::string& path, Env& env);

// Writes `bundle`'s files into `path` (replacing what is there): the data files first,
// then the metadata under a temporary name renamed into place, so that the checkpoint is
// committed only once whole. Throws CorruptionError naming `path` for a bundle that is
// truncated or has no metadata last (nothing is then committed), IoError as the writes
// raise it.
void unpack_checkpoint(const std::string& bundle, const std::string& path, Env& env);

}  // namespace stowage::dcp
