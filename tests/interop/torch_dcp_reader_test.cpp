// TorchDcpReader: loading checkpoints written by PyTorch's torch.distributed.checkpoint
// (torch 2.11.0; tests/interop/fixtures/torch_dcp/make_fixtures.py wrote the fixtures), and
// refusing hostile or corrupt ones by name without touching the destination.

#include "build_paths.h"
#include "dcp/test_util.h"
#include "interop/literal_bytes.h"
#include "interop/torch_save_archive.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/torch_dcp_reader.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace stowage::dcp {
namespace {

using nlohmann::json;
using testing::bytes_of;
using testing::read_file;
using testing::ScratchDir;
using testing::write_file;

const std::string kFixtures = test_paths::source_dir() + "/tests/interop/fixtures/torch_dcp";

// A writable copy of a fixture.
std::string copy_fixture(const ScratchDir& scratch, const std::string& name) {
  std::string to = scratch.sub(name);
  std::filesystem::copy(kFixtures + "/" + name, to, std::filesystem::copy_options::recursive);
  return to;
}

// Replaces the first occurrence of `from` (which must be there) in the file.
void patch_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string bytes = read_file(path);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << "pattern not in " << path;
  bytes.replace(at, from.size(), to);
  write_file(path, bytes);
}

c10::ScalarType dtype_named(const std::string& name) {
  for (c10::ScalarType dtype : {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kLong, c10::kInt,
                                c10::kShort, c10::kChar, c10::kByte, c10::kBool}) {
    if (name == c10::toString(dtype)) return dtype;
  }
  throw std::runtime_error("unknown dtype " + name);
}

std::string hex_of(const at::Tensor& tensor) {
  const at::Tensor contiguous = tensor.contiguous();
  const auto* bytes = static_cast<const uint8_t*>(contiguous.data_ptr());
  std::string out;
  for (size_t i = 0; i < contiguous.nbytes(); ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

// A state dict shaped like the checkpoint: every tensor entry filled with 42, every value
// None; load must replace all of it.
StateDict destination_for(const Metadata& metadata) {
  FlatStateDict flat;
  for (const EntryMetadata& entry : metadata.entries) {
    c10::IValue value;
    if (entry.kind == EntryKind::kTensor) value = at::full(entry.shape, 42, at::TensorOptions().dtype(entry.dtype));
    flat.add(FlatEntry{entry.fqn, entry.path, value});
  }
  return unflatten_state_dict(flat);
}

void expect_value(const c10::IValue& actual, const json& expected, const std::string& fqn) {
  SCOPED_TRACE(fqn);
  if (expected.is_null()) {
    EXPECT_TRUE(actual.isNone());
  } else if (expected.is_boolean()) {
    ASSERT_TRUE(actual.isBool());
    EXPECT_EQ(actual.toBool(), expected.get<bool>());
  } else if (expected.is_number_integer()) {
    ASSERT_TRUE(actual.isInt());
    EXPECT_EQ(actual.toInt(), expected.get<int64_t>());
  } else if (expected.is_number_float()) {
    ASSERT_TRUE(actual.isDouble());
    EXPECT_EQ(actual.toDouble(), expected.get<double>());
  } else if (expected.is_string()) {
    ASSERT_TRUE(actual.isString());
    EXPECT_EQ(actual.toStringRef(), expected.get<std::string>());
  } else {
    ASSERT_TRUE(expected.is_array());
    ASSERT_TRUE(actual.isList());
    const auto list = actual.toList();
    ASSERT_EQ(list.size(), expected.size());
    for (size_t i = 0; i < list.size(); ++i) expect_value(list.get(i), expected[i], fqn);
  }
}

// Loads the checkpoint in `dir` with dcp::load and compares every entry with the
// generator's expected.json, bit for bit.
void expect_loads_as_saved(const std::string& dir) {
  const json expected = json::parse(read_file(dir + "/expected.json"));
  TorchDcpReader reader(dir);
  const Metadata metadata = reader.read_metadata();
  ASSERT_EQ(metadata.entries.size(), expected.size());
  StateDict state = destination_for(metadata);
  load(state, reader);
  const FlatStateDict loaded = flatten_state_dict(state);
  for (const FlatEntry& entry : loaded.entries()) {
    ASSERT_TRUE(expected.contains(entry.fqn)) << entry.fqn;
    const json& want = expected.at(entry.fqn);
    if (want.contains("hex")) {
      SCOPED_TRACE(entry.fqn);
      const at::Tensor& tensor = entry.value.toTensor();
      EXPECT_EQ(tensor.scalar_type(), dtype_named(want.at("dtype").get<std::string>()));
      EXPECT_EQ(tensor.sizes().vec(), want.at("shape").get<std::vector<int64_t>>());
      EXPECT_EQ(hex_of(tensor), want.at("hex").get<std::string>());
    } else {
      expect_value(entry.value, want.at("value"), entry.fqn);
    }
  }
}

TEST(TorchDcpReader, LoadsOneRankCheckpointBitExact) {
  expect_loads_as_saved(kFixtures + "/one_rank");
}

TEST(TorchDcpReader, LoadsAsyncSaveCheckpoint) {
  expect_loads_as_saved(kFixtures + "/async");
}

TEST(TorchDcpReader, LoadsTwoRankCheckpointIntoWholeTensors) {
  expect_loads_as_saved(kFixtures + "/two_ranks");
}

TEST(TorchDcpReader, DescribesEntriesAsDcpSavedThem) {
  TorchDcpReader reader(kFixtures + "/one_rank");
  const Metadata metadata = reader.read_metadata();
  EXPECT_EQ(metadata.version, 0);
  EXPECT_EQ(metadata.world_size, 1);
  EXPECT_EQ(metadata.save_id.size(), 36u);  // DCP's uuid4
  // torch 2.11's AdamW keeps `step` as a 0-dim float tensor: a tensor entry.
  const EntryMetadata* step = metadata.find("optim.state.0.step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->kind, EntryKind::kTensor);
  EXPECT_EQ(step->dtype, c10::kFloat);
  EXPECT_TRUE(step->shape.empty());
  // A list index in the path stays an index; dict keys (also optimizer state's "0") are keys.
  const EntryMetadata* lr = metadata.find("optim.param_groups.0.lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->path, (ObjectPath{"optim", "param_groups", int64_t(0), "lr"}));
  EXPECT_EQ(step->path, (ObjectPath{"optim", "state", "0", "step"}));
  const EntryMetadata* betas = metadata.find("optim.param_groups.0.betas");  // a tuple
  ASSERT_TRUE(betas != nullptr && betas->value.isList());
  EXPECT_EQ(betas->value.toList().elementType()->kind(), c10::TypeKind::FloatType);
  const EntryMetadata* transposed = metadata.find("tensors.transposed");
  ASSERT_NE(transposed, nullptr);
  ASSERT_EQ(transposed->chunks.size(), 1u);
  EXPECT_EQ(transposed->chunks[0].location.file, "__0_0.distcp");
}

TEST(TorchDcpReader, ReadsTheShardsOfTwoRanks) {
  TorchDcpReader reader(kFixtures + "/two_ranks");
  const Metadata metadata = reader.read_metadata();
  EXPECT_EQ(metadata.world_size, 2);
  const EntryMetadata* sharded = metadata.find("sharded");
  ASSERT_NE(sharded, nullptr);
  ASSERT_EQ(sharded->chunks.size(), 2u);
  EXPECT_EQ(sharded->chunks[0].box, (ChunkBox{{0, 0}, {3, 4}}));
  EXPECT_EQ(sharded->chunks[0].rank, 0);
  EXPECT_EQ(sharded->chunks[1].box, (ChunkBox{{3, 0}, {2, 4}}));
  EXPECT_EQ(sharded->chunks[1].rank, 1);
  ASSERT_EQ(metadata.find("replicated")->chunks.size(), 1u);  // written once
}

// A box across both saved shards, into a stowage ShardedTensor: only the overlaps of
// each saved chunk are copied.
TEST(TorchDcpReader, ReshardsIntoAShardedTensorOfOtherBoxes) {
  const json expected = json::parse(read_file(kFixtures + "/two_ranks/expected.json"));
  const at::Tensor whole = at::arange(20, at::kDouble).mul(0.37).sub(5).to(at::kFloat).reshape({5, 4});
  ASSERT_EQ(hex_of(whole), expected.at("sharded").at("hex").get<std::string>());
  at::Tensor local = at::full({3, 2}, 42, at::kFloat);
  StateDict state = testing::state_of({{"sharded", sharded_tensor(local, {5, 4}, {1, 2})}});
  TorchDcpReader reader(kFixtures + "/two_ranks");
  load(state, reader, LoadOptions().allow_partial_load(true));
  EXPECT_TRUE(local.equal(whole.slice(0, 1, 4).slice(1, 2, 4)));
}

TEST(TorchDcpReader, OpenCheckpointPicksTheReaderByWhatTheDirectoryHolds) {
  ScratchDir scratch;
  save(testing::state_of({{"w", at::ones({2})}}), scratch.sub("stowage"));
  EXPECT_NE(dynamic_cast<FileSystemReader*>(open_checkpoint(scratch.sub("stowage")).get()), nullptr);
  EXPECT_NE(dynamic_cast<TorchDcpReader*>(open_checkpoint(kFixtures + "/one_rank").get()), nullptr);
  std::filesystem::create_directory(scratch.sub("empty"));
  try {
    open_checkpoint(scratch.sub("empty"));
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(scratch.sub("empty")), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ hostile input

// Loads `dir` into a copy of the two-rank destination and expects `Exception` whose
// message holds `culprit`; the destination must be untouched.
template <typename Exception>
Exception expect_refused(const std::string& dir, const std::string& culprit) {
  at::Tensor sharded = at::full({5, 4}, 42, at::kFloat);
  at::Tensor replicated = at::full({3, 2}, 42, at::kBFloat16);
  StateDict state = testing::state_of({{"sharded", sharded}, {"replicated", replicated}, {"epoch", int64_t(-1)}});
  try {
    TorchDcpReader reader(dir);
    load(state, reader);
  } catch (const Exception& e) {
    EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
    EXPECT_TRUE(sharded.eq(42).all().item<bool>());
    EXPECT_TRUE(replicated.eq(42).all().item<bool>());
    EXPECT_EQ(state.at("epoch").toInt(), -1);
    return e;
  }
  ADD_FAILURE() << "no " << culprit << " error";
  throw std::runtime_error("not refused");
}

// A .metadata of exactly `pickle`, beside the real two-rank data files.
std::string with_metadata(const ScratchDir& scratch, const std::string& pickle) {
  std::string dir = copy_fixture(scratch, "two_ranks");
  write_file(dir + "/.metadata", pickle);
  return dir;
}

TEST(TorchDcpReaderHostile, UnknownGlobalsAreNamed) {
  ScratchDir scratch;
  const std::string dir = with_metadata(scratch, bytes_of("\x80\x04\x8c\x02os\x8c\x06system\x93."));
  const CorruptionError e = expect_refused<CorruptionError>(dir, "'os.system' is not allowed");
  EXPECT_EQ(e.file(), dir + "/.metadata");
  EXPECT_EQ(e.offset(), 14);  // the STACK_GLOBAL
  write_file(dir + "/.metadata", bytes_of("\x80\x02"
                                          "cbuiltins\neval\n."));
  expect_refused<CorruptionError>(dir, "'builtins.eval' is not allowed");
}

TEST(TorchDcpReaderHostile, ReduceOnlyOfAllowedCallables) {
  ScratchDir scratch;
  // torch.float32 is allowed as a value only.
  const std::string dir = with_metadata(scratch, bytes_of("\x80\x04\x8c\x05torch\x8c\x07"
                                                          "float32\x93)R."));
  expect_refused<CorruptionError>(dir, "REDUCE of 'torch.float32'");
  // A class is instantiated by NEWOBJ, never called.
  write_file(dir + "/.metadata",
             bytes_of("\x80\x04\x8c\x25torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93)R."));
  expect_refused<CorruptionError>(dir, "REDUCE of 'torch.distributed.checkpoint.metadata.Metadata'");
}

TEST(TorchDcpReaderHostile, UnknownProtocolAndOpcodesAreNamed) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  std::string metadata = read_file(dir + "/.metadata");
  ASSERT_EQ(metadata.substr(0, 2), bytes_of("\x80\x04"));
  metadata[1] = 6;
  write_file(dir + "/.metadata", metadata);
  expect_refused<CorruptionError>(dir, "unsupported pickle protocol 6");
  for (const auto& [pickle, name] : std::vector<std::pair<std::string, std::string>>{
           {bytes_of("\x80\x02P1\n."), "PERSID"},
           {bytes_of("\x80\x02(ios\nsystem\n."), "INST"},
           {bytes_of("\x80\x02\x82\x01."), "EXT1"},
           {bytes_of("\x80\x02(X\x01\x00\x00\x00xQ."), "BINPERSID"},
       }) {
    write_file(dir + "/.metadata", pickle);
    expect_refused<CorruptionError>(dir, name);
  }
}

TEST(TorchDcpReaderHostile, LengthsBeyondTheInputAreRefusedBeforeAllocating) {
  ScratchDir scratch;
  // BINUNICODE of 2 GiB - 1 bytes in a 12-byte file.
  const std::string dir = with_metadata(scratch, bytes_of("\x80\x02X\xff\xff\xff\x7f"
                                                          "abc."));
  expect_refused<CorruptionError>(dir, "runs past the end");
  write_file(dir + "/.metadata", read_file(kFixtures + "/two_ranks/.metadata").substr(0, 600));  // truncated
  const CorruptionError e = expect_refused<CorruptionError>(dir, "runs past the end");
  EXPECT_EQ(e.file(), dir + "/.metadata");
}

TEST(TorchDcpReaderHostile, OversizedMetadataIsRefusedByItsSize) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  std::filesystem::resize_file(dir + "/.metadata", (uintmax_t(256) << 20) + 1);  // sparse: nothing is written
  const CorruptionError e = expect_refused<CorruptionError>(dir, "it has 268435457 bytes, more than the 268435456");
  EXPECT_EQ(e.file(), dir + "/.metadata");
}

// A global size whose bytes overflow int64 ([2^60, 4] float32) is refused while the
// metadata is read, naming the entry, before anything is allocated for it.
TEST(TorchDcpReaderHostile, GlobalSizeBeyondAnyByteCountNamesTheEntry) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  // torch.Size((5, 4)) of 'sharded' becomes ((2**60, 4)): LONG1 of 8 bytes.
  patch_file(dir + "/.metadata", bytes_of("K\x05K\x04\x86"),
             bytes_of("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10K\x04\x86"));
  TorchDcpReader reader(dir);
  try {
    reader.read_metadata();
    FAIL() << "no error";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.entry(), "sharded");
    EXPECT_EQ(e.file(), dir + "/.metadata");
    EXPECT_NE(std::string(e.what()).find("overflow a byte count"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ hand-built archives

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

// A zip archive of stored records, as torch.save writes (without its zip64 records).
std::string zip_of(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, directory;
  for (const auto& [name, bytes] : records) {
    const uint32_t crc = detail::crc32(bytes.data(), bytes.size());
    const size_t local = out.size();
    append_le(out, 0x04034b50, 4);
    append_le(out, 20, 2);  // version needed
    append_le(out, 0, 2);   // flags
    append_le(out, 0, 2);   // stored
    append_le(out, 0, 4);   // time, date
    append_le(out, crc, 4);
    append_le(out, bytes.size(), 4);
    append_le(out, bytes.size(), 4);
    append_le(out, name.size(), 2);
    append_le(out, 0, 2);  // extra
    out += name + bytes;
    append_le(directory, 0x02014b50, 4);
    append_le(directory, 20, 2);  // made by
    append_le(directory, 20, 2);  // needed
    append_le(directory, 0, 2);   // flags
    append_le(directory, 0, 2);   // stored
    append_le(directory, 0, 4);   // time, date
    append_le(directory, crc, 4);
    append_le(directory, bytes.size(), 4);
    append_le(directory, bytes.size(), 4);
    append_le(directory, name.size(), 2);
    append_le(directory, 0, 6);  // extra, comment, disk
    append_le(directory, 0, 6);  // attributes
    append_le(directory, local, 4);
    directory += name;
  }
  const size_t directory_at = out.size();
  out += directory;
  append_le(out, 0x06054b50, 4);
  append_le(out, 0, 4);  // disks
  append_le(out, records.size(), 2);
  append_le(out, records.size(), 2);
  append_le(out, directory.size(), 4);
  append_le(out, directory_at, 4);
  append_le(out, 0, 2);  // comment
  return out;
}

std::string long1(int64_t value) {
  std::string out = bytes_of("\x8a\x08");
  append_le(out, static_cast<uint64_t>(value), 8);
  return out;
}

// data.pkl of torch._utils._rebuild_tensor_v2 over a FloatStorage of 3 elements (key
// "0"), its offset, sizes and strides each pickled ints.
std::string tensor_pickle(const std::string& offset, const std::string& sizes, const std::string& strides) {
  return bytes_of(
             "\x80\x02"
             "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage"
             "ctorch\nFloatStorage\nX\x01\x00\x00\x00"
             "0X\x03\x00\x00\x00"
             "cpuK\x03tQ") +
         offset + "(" + sizes + "t(" + strides + "t" + bytes_of("\x89Nt") + "R.";
}

// Reads the [0, 3] float tensor of the archive of `records` (prefix "archive/").
void read_empty_tensor(const ScratchDir& scratch, const std::vector<std::pair<std::string, std::string>>& records) {
  const std::string path = scratch.sub("item");
  write_file(path, zip_of(records));
  const std::unique_ptr<ReadableFile> file = Env::posix()->open_for_reading(path);
  detail::TorchSaveArchive archive(*file, 0, file->size(), "t", "test");
  archive.read_tensor(c10::kFloat, {0, 3}, ChunkBox{{0, 0}, {0, 3}}, at::empty({0, 3}));
}

TEST(TorchDcpReaderHostile, EveryDimensionOfAnEmptyTensorsLayoutIsChecked) {
  ScratchDir scratch;
  const std::string storage(12, '\0');
  const std::string k0 = bytes_of("K\x00"), k1 = bytes_of("K\x01"), k3 = bytes_of("K\x03");
  read_empty_tensor(scratch, {{"archive/data.pkl", tensor_pickle(k0, k0 + k3, k3 + k1)}, {"archive/data/0", storage}});
  for (const auto& [pickle, culprit] : std::vector<std::pair<std::string, std::string>>{
           {tensor_pickle(long1(int64_t(1) << 62), k0 + k3, k3 + k1), "storage offset 4611686018427387904"},
           {tensor_pickle(bytes_of("K\x04"), k0 + k3, k3 + k1), "storage offset 4 lies past"},
           {tensor_pickle(k0, k0 + k3, long1(int64_t(1) << 62) + k1), "stride 4611686018427387904 of dimension 0"},
           {tensor_pickle(k0, k0 + k3, k3 + long1(-1)), "stride -1 of dimension 1"},
       }) {
    SCOPED_TRACE(culprit);
    try {
      read_empty_tensor(scratch, {{"archive/data.pkl", pickle}, {"archive/data/0", storage}});
      ADD_FAILURE() << "no error";
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find(culprit), std::string::npos) << e.what();
      EXPECT_EQ(e.entry(), "t");
      EXPECT_EQ(e.file(), scratch.sub("item"));
      EXPECT_GE(e.offset(), 0);
    }
  }
}

TEST(TorchDcpReaderHostile, OnlyLittleEndianArchivesAreRead) {
  ScratchDir scratch;
  const std::string k0 = bytes_of("K\x00"), k1 = bytes_of("K\x01"), k3 = bytes_of("K\x03");
  const std::string pickle = tensor_pickle(k0, k0 + k3, k3 + k1);
  read_empty_tensor(
      scratch,
      {{"archive/data.pkl", pickle}, {"archive/byteorder", "little"}, {"archive/data/0", std::string(12, '\0')}});
  try {
    read_empty_tensor(
        scratch,
        {{"archive/data.pkl", pickle}, {"archive/byteorder", "big"}, {"archive/data/0", std::string(12, '\0')}});
    FAIL() << "no error";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("record 'archive/byteorder' says 'big', not 'little'"), std::string::npos)
        << e.what();
    EXPECT_EQ(e.entry(), "t");
  }
}

TEST(TorchDcpReaderHostile, ChunkOutsideItsTensorNamesTheEntry) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  // The global size of 'sharded', torch.Size((5, 4)), becomes (2, 4): its chunk at row 3 leaves it.
  patch_file(dir + "/.metadata", bytes_of("K\x05K\x04\x86"), bytes_of("K\x02K\x04\x86"));
  EXPECT_EQ(expect_refused<CorruptionError>(dir, "leaves the tensor").entry(), "sharded");
}

TEST(TorchDcpReaderHostile, FileNamesLeavingTheDirectoryAreRefused) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  patch_file(dir + "/.metadata", "__0_0.distcp", "../x.distcp_");
  EXPECT_EQ(expect_refused<CorruptionError>(dir, "'../x.distcp_' would leave").entry(), "sharded");
}

TEST(TorchDcpReaderHostile, ItemBeyondItsFileIsRefusedBeforeReading) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  // The length of the first item ('sharded' rank 0: BININT2 1577) becomes 65535.
  patch_file(dir + "/.metadata", bytes_of("length\x94M\x29\x06"), bytes_of("length\x94M\xff\xff"));
  const CorruptionError e = expect_refused<CorruptionError>(dir, "needs bytes 0 to 65535");
  EXPECT_EQ(e.entry(), "sharded");
  EXPECT_EQ(e.file(), dir + "/__0_0.distcp");
}

TEST(TorchDcpReaderHostile, CorruptRecordFailsItsCrcNamingEntryFileAndOffset) {
  ScratchDir scratch;
  const std::string dir = copy_fixture(scratch, "two_ranks");
  // -5.0f, the first element of 'sharded', in rank 0's data file.
  std::string data = read_file(dir + "/__0_0.distcp");
  const size_t at = data.find(bytes_of("\x00\x00\xa0\xc0"));
  ASSERT_NE(at, std::string::npos);
  data[at + 3] = '\x40';
  write_file(dir + "/__0_0.distcp", data);
  const CorruptionError e = expect_refused<CorruptionError>(dir, "CRC32");
  EXPECT_EQ(e.entry(), "sharded");
  EXPECT_EQ(e.file(), dir + "/__0_0.distcp");
  EXPECT_EQ(e.offset(), static_cast<int64_t>(at));
  EXPECT_NE(std::string(e.what()).find("archive/data/0"), std::string::npos) << e.what();
}

TEST(TorchDcpReaderHostile, ValuesStowageCannotHoldNameTheEntry) {
  // A Python set: torch.save pickles it through a global the value allow-list lacks.
  TorchDcpReader reader(kFixtures + "/unsupported_value");
  try {
    reader.read_metadata();
    FAIL() << "no error";
  } catch (const CorruptionError& e) {
    EXPECT_EQ(e.entry(), "tags");
    EXPECT_NE(std::string(e.what()).find("set' is not allowed"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ live torch

// With the torch wheel's Python (test_paths::python()), the generator writes the fixtures
// afresh and what it writes loads: the committed fixtures are what torch writes today.
TEST(TorchDcpReaderLive, LoadsWhatTheInstalledTorchWrites) {
  const std::string python = test_paths::python();
  if (python.empty()) GTEST_SKIP() << "built without the torch wheel's Python";
  ScratchDir scratch;
  const std::string command =
      fmt::format("'{}' '{}/make_fixtures.py' '{}' >'{}/log' 2>&1", python, kFixtures, scratch.path(), scratch.path());
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(scratch.sub("log"));
  for (const char* name : {"one_rank", "async", "two_ranks"}) {
    SCOPED_TRACE(name);
    expect_loads_as_saved(scratch.sub(name));
  }
}

}  // namespace
}  // namespace stowage::dcp
