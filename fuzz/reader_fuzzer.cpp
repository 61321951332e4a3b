// libFuzzer target: the file-system reader and load. The input unpacks (fuzz_input.h)
// into a checkpoint directory of a metadata file and two data files; load runs into a
// state whose Stateful values materialise every saved entry from the metadata's shapes,
// so an unchecked size would allocate. Any input either fails with stowage::Error or
// loads.

#include "fuzz_input.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/state/stateful.h>

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include <unistd.h>

namespace {

class Empty final : public stowage::Stateful {
 public:
  stowage::StateDict state_dict() override { return stowage::StateDict(); }
  void load_state_dict(const stowage::StateDict&) override {}
};

const std::string& directory() {
  static const std::string dir = [] {
    std::string pattern = "/tmp/stowage-reader-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stowage;
  const fuzz::PackedCheckpoint input = fuzz::unpack(std::string(reinterpret_cast<const char*>(data), size));
  const std::string& dir = directory();
  fuzz::write_file(dir + "/" + dcp::kMetadataFileName, input.metadata);
  fuzz::write_file(dir + "/a.data", input.a);
  fuzz::write_file(dir + "/b.data", input.b);
  try {
    dcp::FileSystemReader reader(dir);
    const dcp::Metadata metadata = reader.read_metadata();
    StateDict state;
    std::set<std::string> keys;
    for (const dcp::EntryMetadata& entry : metadata.entries) {
      keys.insert(std::get<std::string>(entry.path.front()));
    }
    for (const std::string& key : keys) state.insert(key, as_ivalue(c10::make_intrusive<Empty>()));
    dcp::load(state, reader);
  } catch (const Error&) {
  }
  return 0;
}
