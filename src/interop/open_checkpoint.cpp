#include "dcp/storage/file_io.h"

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/torch_dcp_reader.h>

#include <fmt/format.h>

#include <cerrno>

namespace stowage::dcp {

std::unique_ptr<StorageReader> open_checkpoint(const std::string& path, Env* env) {
  const std::optional<CheckpointFormat> format = committed_format(path, *env);
  if (!format) {
    throw NotFound(fmt::format("'{}' holds no checkpoint: neither stowage's {} nor PyTorch DCP's {} is there", path,
                               kMetadataFileName, kTorchDcpMetadataFileName),
                   detail::join_path(path, kTorchDcpMetadataFileName), "open", ENOENT);
  }
  if (*format == CheckpointFormat::kStowage) return std::make_unique<FileSystemReader>(path, env);
  return std::make_unique<TorchDcpReader>(path, env);
}

}  // namespace stowage::dcp
