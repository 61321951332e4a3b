// export_safetensors and import_safetensors: round trips, the file's layout, shards and
// their index, and what bad input and failures leave behind. (The real safetensors
// package reads and writes these files in python/tests/test_safetensors.py.)
#include <stowage/interop/safetensors.h>

#include "dcp/fault_injection_env.h"
#include "dcp/test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace stowage::dcp::testing {
namespace {

using nlohmann::json;

// A state with a tensor of every dtype both formats hold, a 0-dim and an empty tensor,
// a non-contiguous source, and values.
StateDict mixed_state() {
  torch::manual_seed(7);
  StateDict model;
  model.insert("weight", torch::randn({16, 8}));
  model.insert("bias", torch::randn({8}).to(torch::kBFloat16));
  model.insert("scale", torch::tensor(2.5, torch::kDouble));
  model.insert("empty", torch::empty({0, 4}, torch::kHalf));
  model.insert("transposed", torch::randn({5, 3}).t());
  StateDict extra;
  extra.insert("ids", torch::arange(10, torch::kLong));
  extra.insert("mask", torch::rand({6}) > 0.5);
  extra.insert("bytes", torch::randint(0, 255, {7}, torch::kByte));
  extra.insert("small", torch::randint(-100, 100, {3}, torch::kChar));
  extra.insert("shorts", torch::randint(-100, 100, {3}, torch::kShort));
  extra.insert("ints", torch::randint(-100, 100, {3}, torch::kInt));
  extra.insert("complex", torch::randn({4}, torch::kComplexFloat));
  extra.insert("step", int64_t(12));
  extra.insert("name", std::string("run-a"));
  extra.insert("rate", 0.25);
  return state_of({{"model", model}, {"extra", extra}});
}

// The header of a safetensors file, and the file offset where its data starts.
std::pair<json, int64_t> header_of(const std::string& path) {
  const std::string bytes = read_file(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return {json::parse(bytes.substr(8, length)), 8 + static_cast<int64_t>(length)};
}

void expect_same_leaves(const StateDict& expected, const StateDict& actual) {
  const FlatStateDict want = flatten_state_dict(expected);
  const FlatStateDict got = flatten_state_dict(actual);
  ASSERT_EQ(want.size(), got.size());
  for (const FlatEntry& entry : want.entries()) {
    const FlatEntry* other = got.find(entry.fqn);
    ASSERT_NE(other, nullptr) << entry.fqn;
    if (entry.value.isTensor()) {
      ASSERT_TRUE(other->value.isTensor()) << entry.fqn;
      EXPECT_EQ(entry.value.toTensor().scalar_type(), other->value.toTensor().scalar_type()) << entry.fqn;
      EXPECT_TRUE(torch::equal(entry.value.toTensor(), other->value.toTensor())) << entry.fqn;
    } else {
      EXPECT_EQ(entry.value, other->value) << entry.fqn;
    }
  }
}

// A flat state dict of fresh zero tensors and placeholder values shaped like `state`.
StateDict zeros_like(const StateDict& state) {
  StateDict flat;
  const FlatStateDict leaves = flatten_state_dict(state);
  for (const FlatEntry& entry : leaves.entries()) {
    flat.insert(entry.fqn, entry.value.isTensor() ? torch::zeros_like(entry.value.toTensor()) : entry.value);
  }
  return flat;
}

// Imports `source` into `dir` and loads it into a copy of `state` filled with zeros: it
// must give `state` back, bit for bit.
void expect_imported_as(const StateDict& state, const std::string& source, const std::string& dir) {
  import_safetensors(source, dir);
  StateDict loaded = zeros_like(state);
  load(loaded, dir);
  expect_same_leaves(state, loaded);
}

TEST(DcpSafetensors, ExportThenImportIsBitExactWithValues) {
  ScratchDir dir;
  const StateDict state = mixed_state();
  save(state, dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  const SafetensorsExportResult exported = export_safetensors(reader, dir.sub("model.safetensors"));
  EXPECT_EQ(exported.files, std::vector<std::string>{dir.sub("model.safetensors")});
  EXPECT_EQ(exported.tensors, 12);
  EXPECT_EQ(exported.values, 3);

  const SafetensorsImportResult imported = import_safetensors(dir.sub("model.safetensors"), dir.sub("counted"));
  EXPECT_EQ(imported.tensors, 12);
  EXPECT_EQ(imported.values, 3);
  EXPECT_EQ(imported.tensor_bytes, exported.tensor_bytes);
  expect_imported_as(state, dir.sub("model.safetensors"), dir.sub("back"));
}

TEST(DcpSafetensors, TheFileIsLaidOutAsSafetensorsWritesIt) {
  ScratchDir dir;
  save(mixed_state(), dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  export_safetensors(reader, dir.sub("model.safetensors"));
  const auto [header, data_start] = header_of(dir.sub("model.safetensors"));
  EXPECT_EQ(data_start % 8, 0);
  EXPECT_EQ(header.begin().key(), "__metadata__");
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  const json values = json::parse(header["__metadata__"]["stowage.values"].get<std::string>());
  EXPECT_EQ(values["extra.step"], (json{{"t", "int"}, {"v", 12}}));
  EXPECT_EQ(header["model.bias"]["dtype"], "BF16");
  EXPECT_EQ(header["model.scale"]["shape"], json::array());
  EXPECT_EQ(header["extra.complex"]["dtype"], "C64");
  // Every tensor starts aligned to its element size, and the ranges tile the data.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const auto range = info["data_offsets"].get<std::vector<int64_t>>();
    const int64_t element = info["dtype"] == "F64" || info["dtype"] == "I64" || info["dtype"] == "C64" ? 8
                            : info["dtype"] == "F32" || info["dtype"] == "I32"                         ? 4
                                                                                                       : 1;
    EXPECT_EQ((data_start + range[0]) % element, 0) << name;
    ranges.emplace_back(range[0], range[1]);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].first, ranges[i - 1].second);
  EXPECT_EQ(data_start + ranges.back().second,
            static_cast<int64_t>(std::filesystem::file_size(dir.sub("model.safetensors"))));
}

TEST(DcpSafetensors, ShardsAndTheirIndexFollowHuggingFacesNames) {
  ScratchDir dir;
  StateDict state;
  for (int i = 0; i < 5; ++i) state.insert("layer" + std::to_string(i), torch::full({256}, float(i)));  // 1 KiB each
  save(state, dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  const SafetensorsExportResult result =
      export_safetensors(reader, dir.sub("model.safetensors"), SafetensorsExportOptions().max_shard_bytes(2048));
  EXPECT_EQ(result.files, (std::vector<std::string>{
                              dir.sub("model-00001-of-00003.safetensors"), dir.sub("model-00002-of-00003.safetensors"),
                              dir.sub("model-00003-of-00003.safetensors"), dir.sub("model.safetensors.index.json")}));
  EXPECT_FALSE(std::filesystem::exists(dir.sub("model.safetensors")));
  const json index = json::parse(read_file(dir.sub("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 5 * 1024);
  EXPECT_EQ(index["weight_map"]["layer0"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer2"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer4"], "model-00003-of-00003.safetensors");

  expect_imported_as(state, dir.sub("model.safetensors.index.json"), dir.sub("back"));
}

TEST(DcpSafetensors, APrefixSelectsEntriesAndIsRemovedFromTheirNames) {
  ScratchDir dir;
  save(mixed_state(), dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  const SafetensorsExportResult result =
      export_safetensors(reader, dir.sub("model.safetensors"), SafetensorsExportOptions().prefix("model."));
  EXPECT_EQ(result.tensors, 5);
  EXPECT_EQ(result.values, 0);
  const json header = header_of(dir.sub("model.safetensors")).first;
  EXPECT_TRUE(header.contains("weight"));
  EXPECT_FALSE(header.contains("model.weight"));
  EXPECT_FALSE(header["__metadata__"].contains("stowage.values"));
  EXPECT_THROW(export_safetensors(reader, dir.sub("none.safetensors"), SafetensorsExportOptions().prefix("optim.")),
               InvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir.sub("none.safetensors")));
}

TEST(DcpSafetensors, ATensorNamedLikeTheHeadersMetadataIsRefused) {
  ScratchDir dir;
  save(state_of({{"__metadata__", torch::ones({2})}}), dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  EXPECT_THROW(export_safetensors(reader, dir.sub("model.safetensors")), InvalidArgument);
  EXPECT_EQ(list_files(dir.path()), std::vector<std::string>{"ckpt"});
}

TEST(DcpSafetensors, ExportRefusesAnExistingFileUnlessOverwriting) {
  ScratchDir dir;
  save(state_of({{"w", torch::ones({4})}}), dir.sub("ckpt"));
  write_file(dir.sub("model.safetensors"), "keep me");
  FileSystemReader reader(dir.sub("ckpt"));
  try {
    export_safetensors(reader, dir.sub("model.safetensors"));
    FAIL() << "an existing file was overwritten";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir.sub("model.safetensors")), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(dir.sub("model.safetensors")), "keep me");
  export_safetensors(reader, dir.sub("model.safetensors"), SafetensorsExportOptions().overwrite(true));
  EXPECT_EQ(header_of(dir.sub("model.safetensors")).first["w"]["shape"], json::array({4}));
}

TEST(DcpSafetensors, ADtypeSafetensorsLacksIsRefusedNamingTheEntryBeforeWriting) {
  ScratchDir dir;
  save(state_of({{"a", torch::ones({2})}, {"z", torch::ones({2}, torch::kComplexDouble)}}), dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  try {
    export_safetensors(reader, dir.sub("model.safetensors"));
    FAIL() << "complex double was exported";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(list_files(dir.path()), std::vector<std::string>{"ckpt"});
}

TEST(DcpSafetensors, ACorruptChunkFailsTheExportAndLeavesNoFile) {
  ScratchDir dir;
  save(state_of({{"a", torch::ones({64})}, {"b", torch::ones({64})}}), dir.sub("ckpt"));
  const std::string data = dir.sub("ckpt") + "/" + data_files(dir.sub("ckpt")).at(0);
  std::string bytes = read_file(data);
  bytes[bytes.size() - 3] ^= 0x40;  // in b, written after a
  write_file(data, bytes);
  FileSystemReader reader(dir.sub("ckpt"));
  try {
    export_safetensors(reader, dir.sub("model.safetensors"));
    FAIL() << "a corrupt chunk was exported";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.entry(), "b");
  }
  EXPECT_EQ(list_files(dir.path()), std::vector<std::string>{"ckpt"});
}

TEST(DcpSafetensors, EveryFailedCallOfAnExportLeavesNoFileAndNamesTheCall) {
  ScratchDir dir;
  save(state_of({{"a", torch::ones({300})}, {"b", torch::ones({300})}}), dir.sub("ckpt"));
  FaultInjectionEnv env;
  const auto options = SafetensorsExportOptions().max_shard_bytes(1200).env(&env);
  for (Call call : {Call::kOpen, Call::kWrite, Call::kFsync, Call::kRename}) {
    for (int64_t k = 1;; ++k) {
      FileSystemReader reader(dir.sub("ckpt"));
      env.fail(call, k);
      try {
        export_safetensors(reader, dir.sub("out/model.safetensors"), options);
      } catch (const IoError& e) {
        EXPECT_EQ(e.operation(), operation_of(call)) << e.what();
        EXPECT_EQ(list_files(dir.sub("out")), std::vector<std::string>{}) << operation_of(call) << " " << k;
        continue;
      }
      // The k-th call did not happen: every earlier one was failed and cleaned up.
      EXPECT_GT(k, 1) << operation_of(call) << " is never called";
      EXPECT_EQ(list_files(dir.sub("out")).size(), 3u);
      std::filesystem::remove_all(dir.sub("out"));
      break;
    }
  }
}

// A safetensors file of one F32 tensor "t" of shape [2], with the header `text`.
std::string with_header(const std::string& text, const std::string& data = std::string(8, '\0')) {
  std::string bytes(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(bytes.data(), &length, 8);
  return bytes + text + data;
}

TEST(DcpSafetensors, HostileFilesAreRefusedNamingTheCulpritBeforeAnythingIsWritten) {
  ScratchDir dir;
  const std::string good = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    std::string name;
    std::string bytes;
    std::string culprit;
  };
  std::string huge_length(8, '\xff');
  const std::vector<Case> cases = {
      {"short", "abc", "fewer than"},
      {"length beyond the file", huge_length + "{}", "does not fit"},
      {"not json", with_header("{\"t\":"), "not JSON"},
      {"not an object", with_header("[1,2]"), "not a JSON object"},
      {"repeated name",
       with_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
       "names 't' twice"},
      {"unknown dtype", with_header(R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})"), "unknown dtype 'Q7'"},
      {"negative shape", with_header(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"), "'shape'"},
      {"range of another size", with_header(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
       "hold 8 bytes"},
      // 2^62 + 2 elements of 4 bytes wrap around to 8 bytes in 64 bits.
      {"bytes beyond 64 bits",
       with_header(R"({"t":{"dtype":"F32","shape":[4611686018427387906],"data_offsets":[0,8]}})"), "overflow"},
      {"gap", with_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"), "a gap"},
      {"overlap",
       with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
       "overlaps"},
      {"data beyond the tensors", with_header(good, std::string(12, '\0')), "the file 12"},
      {"metadata not strings", with_header(R"({"__metadata__":{"a":1},)" + good.substr(1)), "map of strings"},
      {"values not json", with_header(R"({"__metadata__":{"stowage.values":"{"},)" + good.substr(1)), "is not JSON"},
  };
  for (const Case& c : cases) {
    write_file(dir.sub("bad.safetensors"), c.bytes);
    try {
      import_safetensors(dir.sub("bad.safetensors"), dir.sub("ckpt"));
      ADD_FAILURE() << c.name << " was imported";
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find(c.culprit), std::string::npos) << c.name << ": " << e.what();
      EXPECT_EQ(e.file(), dir.sub("bad.safetensors")) << c.name;
    }
    EXPECT_FALSE(std::filesystem::exists(dir.sub("ckpt"))) << c.name;
  }
  write_file(dir.sub("bad.safetensors"), with_header(R"({"t":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})"));
  EXPECT_THROW(import_safetensors(dir.sub("bad.safetensors"), dir.sub("ckpt")), InvalidArgument);
}

TEST(DcpSafetensors, AnIndexNamingAShardOutsideItsDirectoryOrAMissingTensorIsRefused) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.sub("models"));
  write_file(dir.sub("secret.safetensors"), with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"));
  write_file(dir.sub("models/index.json"), R"({"weight_map":{"t":"../secret.safetensors"}})");
  try {
    import_safetensors(dir.sub("models/index.json"), dir.sub("ckpt"));
    FAIL() << "a shard outside the index's directory was read";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.entry(), "t");
  }
  std::filesystem::copy_file(dir.sub("secret.safetensors"), dir.sub("models/a.safetensors"));
  write_file(dir.sub("models/index.json"), R"({"weight_map":{"t":"a.safetensors","u":"a.safetensors"}})");
  EXPECT_THROW(import_safetensors(dir.sub("models/index.json"), dir.sub("ckpt")), CorruptionError);
  write_file(dir.sub("models/index.json"), R"({"weight_map":{}})");
  EXPECT_THROW(import_safetensors(dir.sub("models/index.json"), dir.sub("ckpt")), CorruptionError);
  EXPECT_FALSE(std::filesystem::exists(dir.sub("ckpt")));
}

TEST(DcpSafetensors, ImportRefusesAnExistingCheckpointUnlessOverwriting) {
  ScratchDir dir;
  save(state_of({{"w", torch::ones({4})}}), dir.sub("ckpt"));
  FileSystemReader reader(dir.sub("ckpt"));
  export_safetensors(reader, dir.sub("model.safetensors"));
  save(state_of({{"other", torch::zeros({2})}}), dir.sub("existing"));
  EXPECT_THROW(import_safetensors(dir.sub("model.safetensors"), dir.sub("existing")), Error);
  EXPECT_NE(FileSystemReader(dir.sub("existing")).read_metadata().find("other"), nullptr);
  import_safetensors(dir.sub("model.safetensors"), dir.sub("existing"),
                     SafetensorsImportOptions().writer(FileSystemWriterOptions().overwrite(true)));
  EXPECT_NE(FileSystemReader(dir.sub("existing")).read_metadata().find("w"), nullptr);
}

}  // namespace
}  // namespace stowage::dcp::testing
