// libFuzzer target: the metadata parser (dcp::decode_metadata). Any input either fails
// with stowage::Error or decodes to metadata that encodes and decodes again to the same.

#include <stowage/dcp/metadata.h>
#include <stowage/error.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage;
  const std::string text(reinterpret_cast<const char*>(data), size);
  dcp::Metadata metadata;
  try {
    metadata = dcp::decode_metadata(text, "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  try {
    const dcp::Metadata again = dcp::decode_metadata(dcp::encode_metadata(metadata), "re-encoded");
    if (again.entries.size() != metadata.entries.size() || again.save_id != metadata.save_id) std::abort();
  } catch (const Error& e) {
    std::fprintf(stderr, "accepted metadata does not round-trip: %s\n", e.what());
    std::abort();
  }
  return 0;
}
