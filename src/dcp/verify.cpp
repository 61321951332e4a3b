#include <stowage/dcp/verify.h>
#include <stowage/error.h>

#include <ATen/ATen.h>

#include <vector>

namespace stowage::dcp {

VerifyReport verify(StorageReader& reader) {
  VerifyReport report;
  try {
    const Metadata metadata = reader.read_metadata();
    for (const EntryMetadata& entry : metadata.entries) {
      for (const TensorChunk& chunk : entry.chunks) {
        std::vector<ChunkRead> reads(1);
        reads[0].entry = &entry;
        reads[0].chunk = &chunk;
        // The chunk's elements: what any reader fills, whatever its files hold them as
        // (stowage's raw bytes, PyTorch DCP's torch.save archives).
        reads[0].buffer = at::empty(chunk.box.sizes, at::TensorOptions().dtype(entry.dtype));
        reader.read_data(reads);
        ++report.chunks_verified;
        report.bytes_verified += static_cast<int64_t>(reads[0].buffer.nbytes());
      }
    }
  } catch (const Error& e) {
    report.error = e.what();
  }
  return report;
}

}  // namespace stowage::dcp
