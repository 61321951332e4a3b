// `stowage ckpt ls | inspect | verify` on a checkpoint whose metadata or data file is a
// FIFO: each fails at once, naming the FIFO, instead of blocking in open().

#include "cli/cli_util.h"

#include <stowage/dcp/dcp.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

namespace stowage::testing {
namespace {

namespace fs = std::filesystem;

class RunWithACheckpoint {
 public:
  RunWithACheckpoint() {
    std::string pattern = (fs::temp_directory_path() / "stowage-ckpt-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    run_ = pattern;
    checkpoint_ = run_ + "/checkpoints/step-00000006";
    StateDict state;
    state.insert("w", torch::ones({32}));
    dcp::save(state, checkpoint_);
  }
  ~RunWithACheckpoint() {
    std::error_code ignored;
    fs::remove_all(run_, ignored);
  }
  const std::string& run() const { return run_; }
  const std::string& checkpoint() const { return checkpoint_; }
  // Replaces the file by a FIFO and returns its path.
  std::string fifo_instead_of(const std::string& name) const {
    std::string path = checkpoint_ + "/" + name;  // not const: returned, it moves
    fs::remove(path);
    if (::mkfifo(path.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed");
    return path;
  }
  std::string data_file() const {
    for (const auto& entry : fs::directory_iterator(checkpoint_)) {
      if (entry.path().filename().string().rfind("data-", 0) == 0) return entry.path().filename().string();
    }
    throw std::runtime_error("no data file");
  }

 private:
  std::string run_;
  std::string checkpoint_;
};

// `timeout` ends a command blocked on the FIFO with status 124.
CommandResult ckpt(const std::string& args) {
  return run_command("timeout 60 " + stowage_binary() + " ckpt " + args);
}

void expect_fails_naming(const CommandResult& result, const std::string& fifo) {
  EXPECT_NE(result.status, 124) << "blocked on " << fifo;
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_NE(result.output.find(fifo), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("is a FIFO, not a regular file"), std::string::npos) << result.output;
}

TEST(CliCkpt, AFifoInPlaceOfTheMetadataFailsEverySubcommandAtOnce) {
  const RunWithACheckpoint run;
  const std::string fifo = run.fifo_instead_of(dcp::kMetadataFileName);
  expect_fails_naming(ckpt("ls " + run.run()), fifo);
  expect_fails_naming(ckpt("inspect " + run.checkpoint()), fifo);
  expect_fails_naming(ckpt("verify " + run.checkpoint()), fifo);
}

TEST(CliCkpt, AFifoInPlaceOfADataFileFailsEverySubcommandAtOnce) {
  const RunWithACheckpoint run;
  const std::string fifo = run.fifo_instead_of(run.data_file());
  expect_fails_naming(ckpt("ls " + run.run()), fifo);
  expect_fails_naming(ckpt("inspect " + run.checkpoint()), fifo);
  expect_fails_naming(ckpt("verify " + run.checkpoint()), fifo);
  expect_fails_naming(ckpt("verify --json " + run.checkpoint()), fifo);
}

}  // namespace
}  // namespace stowage::testing
