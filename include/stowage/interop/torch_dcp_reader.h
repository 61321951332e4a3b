#pragma once

// Reading checkpoints that PyTorch's torch.distributed.checkpoint wrote
// (dcp.save / dcp.async_save with FileSystemWriter, torch 2.3 to 2.11): a StorageReader
// for stowage::dcp::load, with its resharding. docs/FORMAT.md, "Reading PyTorch DCP
// checkpoints", says what is read and what is refused.
//
// Nothing is executed: `.metadata` (a pickle) and each item's data.pkl are decoded by a
// restricted unpickler that knows only DCP's metadata classes and torch.save's tensor
// records; any other global, callable or opcode is a CorruptionError naming it. Every
// location is checked against its data file's size before anything is read, and every
// zip record read is checked against its CRC32 (DCP keeps no other checksum).

#include <stowage/dcp/checkpoint_directory.h>  // kTorchDcpMetadataFileName
#include <stowage/dcp/env.h>
#include <stowage/dcp/storage.h>

#include <memory>
#include <string>
#include <unordered_map>

namespace stowage::dcp {

class TorchDcpReader : public StorageReader {
 public:
  // Every file-system call goes through `env` (env.h), which must outlive the reader.
  explicit TorchDcpReader(std::string path, Env* env = Env::posix());
  ~TorchDcpReader() override;

  const std::string& path() const { return path_; }

  // Decodes `.metadata` and checks it whole (types, chunk boxes tiling each tensor,
  // plain data file names, every item inside its file), then reads every non-tensor
  // value (each a small torch.save archive) into the metadata: DCP keeps them in the
  // data files, stowage's Metadata inline. Tensor entries get a chunk per saved shard,
  // located at its item (file, offset, length; no checksums); version is 0 (no stowage
  // format), save_id DCP's save id, world_size one more than the highest rank in the
  // data file names.
  //
  // Throws CorruptionError naming the file and the culprit (opcode, global, entry,
  // offset) for malformed or hostile metadata, a missing data file or an item beyond
  // its file's end; Error naming the entry for a value stowage cannot hold (an object,
  // a nested list, an int beyond 64 bits: docs/FORMAT.md).
  Metadata read_metadata() override;

  // Fills every buffer with its chunk's region, decoded from the chunk's torch.save
  // archive (its storage offset, sizes and strides honoured). Throws CorruptionError
  // naming the entry, the file and the offset for a malformed archive, a tensor that is
  // not what the metadata says, or a record whose CRC32 does not match.
  void read_data(std::vector<ChunkRead>& reads) override;

 private:
  struct OpenFile;
  const OpenFile& file_for(const std::string& fqn, const std::string& name) const;

  std::string path_;
  Env* env_;
  // The data files of the checkpoint read_metadata() returned, opened then.
  std::unordered_map<std::string, std::unique_ptr<OpenFile>> files_;
};

}  // namespace stowage::dcp
