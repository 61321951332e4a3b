#pragma once

// Opening a checkpoint whichever wrote it: stowage or PyTorch's torch.distributed.checkpoint.

#include <stowage/dcp/env.h>
#include <stowage/dcp/storage.h>

#include <memory>
#include <string>

namespace stowage::dcp {

// A reader for the checkpoint in `path`, by the format committed there
// (dcp::committed_format, checkpoint_directory.h): stowage's `.metadata.json` gives a
// FileSystemReader, PyTorch DCP's `.metadata` a TorchDcpReader.
// Throws NotFound (an IoError, ENOENT) naming the path when it holds neither.
// Every file-system call goes through `env`, which must outlive the reader.
std::unique_ptr<StorageReader> open_checkpoint(const std::string& path, Env* env = Env::posix());

}  // namespace stowage::dcp
