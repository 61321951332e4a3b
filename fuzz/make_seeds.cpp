// Writes the seed corpora of the fuzzers (fuzz/corpus/): small real checkpoints saved
// by dcp::save, their data files renamed to a.data and b.data for the reader fuzzer.
// Run it again when the format changes (tests/dcp/format_version_test.cpp checks the
// seeds' version); the metadata seeds version-<v>.json are older formats, copied from
// tests/dcp/fixtures/, and stay.
//
//   make_seeds CORPUS_DIR

#include "fuzz_input.h"

#include <stowage/dcp/dcp.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stowage;
  if (argc != 2) return 2;
  const std::string corpus = argv[1];
  std::filesystem::create_directories(corpus + "/metadata");
  std::filesystem::create_directories(corpus + "/reader");
  std::vector<StateDict> states(3);
  states[0].insert("w", at::arange(6, at::kFloat).reshape({2, 3}));
  states[0].insert("step", int64_t(3));
  StateDict inner;
  inner.insert("bias", at::ones({2}, at::kDouble));
  inner.insert("mask", at::zeros({3}, at::kBool));
  inner.insert("lr", 0.5);
  inner.insert("betas", c10::List<double>({0.9, 0.999}));
  inner.insert("name", std::string("adam"));
  inner.insert("none", c10::IValue());
  states[1].insert("opt", c10::IValue(inner));
  states[1].insert("e", at::empty({0, 2}, at::kHalf));
  states[2].insert("m", at::arange(4, at::kLong));
  states[2].insert("n", at::arange(3, at::kBFloat16));
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string dir = corpus + "/tmp-" + std::to_string(i);
    std::filesystem::remove_all(dir);
    dcp::FileSystemWriter writer(dir, dcp::FileSystemWriterOptions().thread_count(2).sync_files(false));
    dcp::Metadata metadata = dcp::save(states[i], writer);
    const std::vector<std::string> files = metadata.files();
    fuzz::PackedCheckpoint packed;
    for (size_t f = 0; f < files.size() && f < 2; ++f) {
      const std::string renamed = f == 0 ? "a.data" : "b.data";
      (f == 0 ? packed.a : packed.b) = read(dir + "/" + files[f]);
      for (dcp::EntryMetadata& entry : metadata.entries) {
        for (dcp::TensorChunk& chunk : entry.chunks) {
          if (chunk.location.file == files[f]) chunk.location.file = renamed;
        }
      }
    }
    packed.metadata = dcp::encode_metadata(metadata);
    fuzz::write_file(corpus + "/metadata/seed-" + std::to_string(i) + ".json", packed.metadata);
    fuzz::write_file(corpus + "/reader/seed-" + std::to_string(i) + ".bin", fuzz::pack(packed));
    std::filesystem::remove_all(dir);
  }
  return 0;
}
