// `stowage ckpt ls | inspect | verify | export` on a checkpoint PyTorch's
// torch.distributed.checkpoint wrote (tests/interop/fixtures/torch_dcp/one_rank, torch 2.11).

#include "build_paths.h"
#include "cli/train_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace stowage::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

// A copy of the fixture, which a test may damage, and the bytes it expects.
class TorchDcpCheckpoint {
 public:
  TorchDcpCheckpoint() {
    fs::copy(fs::path(test_paths::source_dir()) / "tests/interop/fixtures/torch_dcp/one_rank", dir_.path);
    expected_ = json::parse(read_bytes(dir_.path / "expected.json"));
  }
  std::string path() const { return dir_.str(); }
  std::string weight_bytes() const { return from_hex(expected_["model.weight"]["hex"].get<std::string>()); }

 private:
  RunDir dir_;
  json expected_;
};

TEST(CkptTorchDcp, LsAndInspectDescribeIt) {
  const TorchDcpCheckpoint checkpoint;
  const json listed = run_json("ckpt ls --json " + checkpoint.path());
  ASSERT_EQ(listed.size(), 1u) << listed.dump();
  EXPECT_EQ(listed[0]["format"], "pytorch-dcp");
  EXPECT_TRUE(listed[0]["step"].is_null());

  const json inspected = run_json("ckpt inspect --json " + checkpoint.path());
  EXPECT_EQ(inspected["format"], "pytorch-dcp");
  const auto& entries = inspected["entries"];
  const auto weight =
      std::find_if(entries.begin(), entries.end(), [](const json& e) { return e["key"] == "model.weight"; });
  ASSERT_NE(weight, entries.end()) << inspected.dump(2);
  EXPECT_EQ((*weight)["dtype"], "Float");
  EXPECT_EQ((*weight)["shape"], json::array({3, 4}));
  EXPECT_EQ((*weight)["chunks"][0]["checksum"], "-");
}

TEST(CkptTorchDcp, VerifyChecksTheRecordsAndNamesADamagedEntry) {
  const TorchDcpCheckpoint checkpoint;
  EXPECT_TRUE(run_json("ckpt verify --json " + checkpoint.path())["ok"]);

  // One bit of the weight's stored bytes flipped: its zip record's CRC32 no longer matches.
  const fs::path data = fs::path(checkpoint.path()) / "__0_0.distcp";
  std::string bytes = read_bytes(data);
  const size_t at = bytes.find(checkpoint.weight_bytes());
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] ^= 0x01;
  std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
  const auto result = run_command(stowage_binary() + " ckpt verify " + checkpoint.path());
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("'model.weight'"), std::string::npos) << result.output;
}

TEST(CkptTorchDcp, ExportsTheModelAsSafetensors) {
  const TorchDcpCheckpoint checkpoint;
  const std::string out = checkpoint.path() + "/model.safetensors";
  const json report = run_json("ckpt export --json " + checkpoint.path() + " --prefix model. --out " + out);
  EXPECT_EQ(report["tensors"], 2);
  const std::string file = read_bytes(out);
  uint64_t length = 0;
  std::memcpy(&length, file.data(), 8);
  const json header = json::parse(file.substr(8, length));
  EXPECT_EQ(header["weight"]["shape"], json::array({3, 4}));
  const auto range = header["weight"]["data_offsets"].get<std::vector<size_t>>();
  EXPECT_EQ(file.substr(8 + length + range[0], range[1] - range[0]), checkpoint.weight_bytes());
}

}  // namespace
}  // namespace stowage::testing
