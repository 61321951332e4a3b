// Hostile metadata: well-formed JSON with a valid checksum (so only validation can stop
// it) that claims escaping paths, absurd sizes and offsets, overlapping chunks, unknown
// dtypes or another version. Load must reject it naming the entry, before it allocates
// anything: the CPU allocator's peak and the host buffers stay flat, even for entries a
// Stateful would have materialised from the metadata's shapes.

#include "dcp/test_util.h"
#include "reliability/report.h"

#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/stateful.h>

#include <gtest/gtest.h>

#include <functional>
#include <limits>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;

// A Stateful that has nothing yet: load materialises every saved entry under its key,
// with the shapes the metadata claims.
class Empty final : public Stateful {
 public:
  StateDict state_dict() override { return StateDict(); }
  void load_state_dict(const StateDict& state) override { loaded = state; }
  StateDict loaded;
};

struct Case {
  std::string name;
  std::function<void(dcp::Metadata&)> damage;
  std::string expected;  // part of the error message
};

// A valid checkpoint of one 1 KiB tensor under "opt", written by save().
dcp::Metadata save_base(const std::string& dir) {
  StateDict inner;
  inner.insert("w", torch::arange(256, torch::kFloat));
  StateDict state;
  state.insert("opt", c10::IValue(inner));
  return dcp::save(state, dir);
}

dcp::TensorChunk& first_chunk(dcp::Metadata& m) {
  return m.entries.at(0).chunks.at(0);
}

TEST(HostileMetadata, IsRejectedBeforeAnyAllocationOrRead) {
  constexpr int64_t kHuge = int64_t(1) << 40;
  const std::vector<Case> cases = {
      {"path escaping the directory", [](dcp::Metadata& m) { first_chunk(m).location.file = "../outside.data"; },
       "would leave the checkpoint directory"},
      {"absolute path", [](dcp::Metadata& m) { first_chunk(m).location.file = "/etc/passwd"; },
       "would leave the checkpoint directory"},
      {"parent directory", [](dcp::Metadata& m) { first_chunk(m).location.file = ".."; },
       "would leave the checkpoint directory"},
      {"huge shape and length",
       [&](dcp::Metadata& m) {
         m.entries[0].shape = {kHuge};
         first_chunk(m).box = {{0}, {kHuge}};
         first_chunk(m).location.length = kHuge * 4;
       },
       "'opt.w'"},  // rejected for its missing block checksums, before its size is trusted
      {"negative size", [](dcp::Metadata& m) { first_chunk(m).box.sizes = {-256}; }, "opt.w"},
      {"negative offset", [](dcp::Metadata& m) { first_chunk(m).location.offset = -64; }, "must not be negative"},
      {"offset past the end", [](dcp::Metadata& m) { first_chunk(m).location.offset = int64_t(1) << 50; }, "truncated"},
      {"offset overflowing",
       [](dcp::Metadata& m) { first_chunk(m).location.offset = std::numeric_limits<int64_t>::max() - 8; }, "overflows"},
      {"overlapping chunks of a tensor",
       [](dcp::Metadata& m) {
         dcp::TensorChunk second = first_chunk(m);
         m.entries[0].chunks.push_back(second);
       },
       "overlap"},
      {"chunks of two entries sharing bytes",
       [](dcp::Metadata& m) {
         dcp::EntryMetadata copy = m.entries[0];
         copy.fqn = "opt.v";
         copy.path = {std::string("opt"), std::string("v")};
         m.entries.push_back(copy);
       },
       "overlap in data file"},
      {"unknown dtype", [](dcp::Metadata& m) { m.entries[0].dtype = c10::kQInt8; }, "unknown dtype 'QInt8'"},
      {"chunk of another rank",
       [](dcp::Metadata& m) {
         first_chunk(m).box = {{0, 0}, {256, 1}};
       },
       "dimensions"},
  };
  int64_t rejected = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ScratchDir dir;
    dcp::Metadata metadata = save_base(dir.path());
    c.damage(metadata);
    dcp::testing::write_file(dcp::testing::metadata_path(dir.path()), dcp::encode_metadata(metadata));
    auto object = c10::make_intrusive<Empty>();
    StateDict target;
    target.insert("opt", as_ivalue(object));
    const int64_t host_before = memory::host_buffer_stats().current_bytes;
    memory::reset_peak_memory_stats(c10::kCPU);
    const int64_t baseline = memory::memory_allocated(c10::kCPU);
    try {
      dcp::load(target, dir.path());
      ADD_FAILURE() << "hostile metadata loaded";
    } catch (const CorruptionError& e) {  // every case is stored bytes that are not what was written
      EXPECT_NE(std::string(e.what()).find(c.expected), std::string::npos) << e.what();
      ++rejected;
    }
    // The tensor the checkpoint really holds is 1 KiB; anything near the claimed sizes
    // would show here.
    EXPECT_LT(memory::max_memory_allocated(c10::kCPU) - baseline, 64 * 1024);
    EXPECT_EQ(memory::host_buffer_stats().current_bytes, host_before);
    EXPECT_EQ(object->loaded.size(), 0u);
  }
  record_figure("hostile_metadata.cases_rejected", rejected);
}

TEST(HostileMetadata, TamperedTextFailsTheMetadataChecksum) {
  const ScratchDir dir;
  StateDict state;
  state.insert("step", int64_t(1234));
  state.insert("lr", 0.5);
  dcp::save(state, dir.path());
  const std::string path = dcp::testing::metadata_path(dir.path());
  const std::string good = dcp::testing::read_file(path);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"1234", "1235"}, {"0.5", "0.7"}, {"\"world_size\":1", "\"world_size\":2"}}) {
    std::string text = good;
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    dcp::testing::write_file(path, text);
    StateDict target;
    target.insert("step", int64_t(0));
    target.insert("lr", 0.0);
    try {
      dcp::load(target, dir.path());
      ADD_FAILURE() << from << " -> " << to << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dcp::kMetadataFileName), std::string::npos) << e.what();
    }
    EXPECT_EQ(target.at("step").toInt(), 0);
  }
  // Layout is not content: re-indented metadata still loads.
  std::string reindented;
  for (char ch : good) reindented += ch == '\n' ? std::string("\n   ") : std::string(1, ch);
  dcp::testing::write_file(path, reindented);
  StateDict target;
  target.insert("step", int64_t(0));
  target.insert("lr", 0.0);
  dcp::load(target, dir.path());
  EXPECT_EQ(target.at("step").toInt(), 1234);
}

// Found by the metadata fuzzer: nlohmann::json reports a number beyond double's range
// as out_of_range, not parse_error; it escaped decode_metadata as a foreign exception.
TEST(HostileMetadata, ANumberOutOfRangeIsAnError) {
  try {
    dcp::decode_metadata(R"({"format": "stowage.dcp", "version": 1e400})", "test.json");
    ADD_FAILURE() << "decoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.json is not valid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stowage::reliability
