#pragma once

// PyTorch DCP's `.metadata` (a pickle of torch.distributed.checkpoint.metadata.Metadata)
// turned into stowage's Metadata, with every field checked before any data is read.

#include <stowage/dcp/metadata.h>

#include <string>
#include <string_view>
#include <vector>

namespace stowage::dcp::detail {

// A BytesStorageMetadata entry: its value is a torch.save archive at `location`, decoded
// by the reader (metadata.entries[entry].value is None until then).
struct TorchDcpValueItem {
  size_t entry = 0;
  StorageLocation location;
};

struct TorchDcpMetadata {
  // Tensor entries with their chunks (location: the item's file, offset and length;
  // no checksums), value entries, in the order of the file's state_dict_metadata.
  // version is 0 (not a stowage format), save_id the StorageMeta's save id (empty when
  // absent), world_size one more than the highest rank in the data files' names
  // ("__<rank>_<k>.distcp"; 1 when none is so named).
  Metadata metadata;
  std::vector<TorchDcpValueItem> values;
};

// Decodes a `.metadata` file's bytes. `origin` names it in errors. Throws
// CorruptionError naming the file and the culprit (the opcode, global, entry or field)
// for anything else than DCP's metadata classes of torch 2.3 to 2.11: a global outside
// the allow-list (docs/FORMAT.md), a wrong type, a chunk outside its tensor or chunks
// that do not tile it, a data file name that is not a plain name, a tensor chunk or a
// value without a storage location, a global size whose bytes overflow int64, more than
// 65,536 chunks in an entry, or names and sizes shared from so many places that copying
// them would take more than 32 times the input's size plus 16 MiB. The unpickler's
// budget (restricted_unpickler.h) bounds the rest of the memory by the input's size.
TorchDcpMetadata decode_torch_dcp_metadata(std::string_view bytes, const std::string& origin);

// Whether `name` is what torch writes for a dtype (torch.float32's pickle name is
// "float32"), and which one; false for dtypes stowage does not hold.
bool torch_dtype_from_name(const std::string& name, c10::ScalarType* dtype);

}  // namespace stowage::dcp::detail
