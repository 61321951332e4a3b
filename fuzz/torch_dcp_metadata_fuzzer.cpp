// libFuzzer target: PyTorch DCP's .metadata, through the restricted unpickler and the
// conversion to stowage's Metadata (src/interop/torch_dcp_metadata.h). Any input either
// fails with stowage::Error or decodes to metadata whose tensors are tiled by their
// chunks and whose data file names are plain names.

#include "dcp/format/checks.h"
#include "interop/torch_dcp_metadata.h"

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage;
  dcp::detail::TorchDcpMetadata decoded;
  try {
    decoded = dcp::detail::decode_torch_dcp_metadata(std::string_view(reinterpret_cast<const char*>(data), size),
                                                     "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  try {
    for (const dcp::EntryMetadata& entry : decoded.metadata.entries) {
      std::vector<dcp::ChunkBox> boxes;
      for (const dcp::TensorChunk& chunk : entry.chunks) {
        if (!dcp::is_safe_file_name(chunk.location.file)) std::abort();
        boxes.push_back(chunk.box);
      }
      if (entry.kind == dcp::EntryKind::kTensor) dcp::detail::check_tiling(entry.shape, boxes, entry.fqn);
    }
    for (const dcp::detail::TorchDcpValueItem& item : decoded.values) {
      if (item.entry >= decoded.metadata.entries.size() || !dcp::is_safe_file_name(item.location.file)) std::abort();
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "accepted metadata fails its own checks: %s\n", e.what());
    std::abort();
  }
  return 0;
}
