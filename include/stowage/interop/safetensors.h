#pragma once

// Checkpoints to and from Hugging Face safetensors (docs/FORMAT.md, "safetensors"): the
// tensors of a checkpoint as one .safetensors file, or as shards and the
// `<file>.index.json` that Hugging Face writes beside them; and back.
//
// Both directions stream: export holds one tensor (assembled from its chunks) at a time,
// import writes the checkpoint from read-only mappings of the files it reads. Neither
// leaves a partial file under a final name: every file is written under a temporary
// name, synced, and renamed once all of them are complete; a failure removes what was
// written. Non-tensor values travel in the header's `__metadata__` under the key
// "stowage.values" (their checkpoint encoding, as JSON text); the header also says
// `"format": "pt"`, which transformers requires.

#include <stowage/dcp/env.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/storage.h>

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::dcp {

struct SafetensorsExportOptions {
  // Only the entries whose name starts with it, which is removed from their names (a
  // module's weights under "model." export as a plain module state dict). Empty: all.
  TORCH_ARG(std::string, prefix) = "";
  // Tensors are placed in shards of at most this many bytes, in checkpoint order; a
  // tensor larger than that gets a shard of its own. Hugging Face's default is 5 GB.
  TORCH_ARG(int64_t, max_shard_bytes) = 5'000'000'000;
  // Replace existing files; without it an existing output file is an error and nothing
  // is written.
  TORCH_ARG(bool, overwrite) = false;
  // Every file-system call of the output goes through it; it must outlive the call.
  TORCH_ARG(EnvPointer, env) = Env::posix();
};

struct SafetensorsExportResult {
  // The files written: the one .safetensors file, or the shards then the index.
  std::vector<std::string> files;
  int64_t tensors = 0;
  int64_t tensor_bytes = 0;
  int64_t values = 0;  // non-tensor entries, in __metadata__
};

// Writes the tensors of the checkpoint `reader` reads as safetensors at `out` (a path
// ending in ".safetensors"). When they fit one shard, `out` is that file; otherwise the
// shards are `<stem>-00001-of-0000N.safetensors` beside it and the index is
// `<out>.index.json` (Hugging Face's names for out = "model.safetensors"). Every chunk is
// verified against its checksums as it is read.
// Throws InvalidArgument for a bad `out`, an option out of range, an existing file
// without overwrite, a prefix no entry has, or a dtype safetensors cannot hold (naming
// the entry: complex half and complex double); the reader's errors otherwise (IoError,
// CorruptionError naming the entry and file). Nothing is left under a final name then.
SafetensorsExportResult export_safetensors(StorageReader& reader, const std::string& out,
                                           const SafetensorsExportOptions& options = {});

struct SafetensorsImportOptions {
  // How the checkpoint is written; overwrite is off unless set here.
  TORCH_ARG(FileSystemWriterOptions, writer) = FileSystemWriterOptions().overwrite(false);
  // Every file-system call reading the safetensors goes through it; it must outlive the
  // call (the writer's calls go through the writer's own env).
  TORCH_ARG(EnvPointer, env) = Env::posix();
};

struct SafetensorsImportResult {
  std::vector<std::string> files;  // the safetensors files read
  int64_t tensors = 0;
  int64_t tensor_bytes = 0;
  int64_t values = 0;
};

// Writes a stowage checkpoint into `checkpoint_dir` from `source`: a .safetensors file,
// or a `*.index.json` naming shards in its directory. Tensor names become the entries'
// names; "stowage.values" in __metadata__ (as export writes it) become values.
// Every header is validated before any data is read (interop rules of the format: JSON
// object, no duplicate names, known dtypes, offsets that tile the data exactly and match
// each shape, the file's size): CorruptionError naming the file and the tensor
// otherwise. An index's shard names must be plain file names in its directory.
SafetensorsImportResult import_safetensors(const std::string& source, const std::string& checkpoint_dir,
                                           const SafetensorsImportOptions& options = {});

}  // namespace stowage::dcp
