// What the directory argument of `stowage ckpt ls | inspect | verify | export` may be:
// one checkpoint, a directory of step-<N> checkpoints whatever its name (a
// CheckpointManager's), or a run directory (its checkpoints/ folder). Given one of the
// last two, inspect, verify and export take its latest committed checkpoint and say
// which. Anything else is an error naming the path and the three. And export and import
// over existing output fail with the library's message, naming the path and the option
// overwrite (--overwrite), unrewritten.

#include "build_paths.h"
#include "cli/in_process.h"
#include "cli/train_util.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/dcp.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace stowage::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

// The commands run in this process (cli/in_process.h); the other ckpt_*_test.cpp run the
// built tool.
CommandResult ckpt_command(const std::string& args) {
  return run_in_process("ckpt " + args);
}

// What `args` printed, a JSON document, once it exited 0.
json json_in_process(const std::string& args) {
  const CommandResult result = run_in_process(args);
  EXPECT_EQ(result.status, 0) << args << "\n" << result.output;
  return json::parse(result.output);
}

StateDict state_of(double value) {
  StateDict state;
  state.insert("w", torch::full({16}, value));
  state.insert("step", static_cast<int64_t>(value));
  return state;
}

// Committed checkpoints of steps 2 and 4 in `directory`, as a CheckpointManager writes
// them, and then an uncommitted step-6 (a save in flight, or the remains of a failed one).
// Returns the path of step 4.
std::string save_steps_two_and_four(const std::string& directory) {
  std::string latest;
  fs::create_directories(directory);
  {
    // Each state outlives its save: it is staged in the background.
    const StateDict two = state_of(2), four = state_of(4);
    dcp::CheckpointManager manager(directory, dcp::CheckpointManagerOptions().save_every(2).keep_last(0));
    manager.save(2, two);
    manager.save(4, four);
    manager.wait();
    latest = manager.checkpoint_path(4);
  }
  const fs::path uncommitted = fs::path(directory) / "step-00000006";
  fs::create_directories(uncommitted);
  std::ofstream(uncommitted / "data-0-r0-0.data") << "half-written";
  return latest;
}

// Each command on `dir` (a directory of checkpoints, or a run directory) takes
// `latest`, says so, and keeps its --json output one JSON document.
void expect_every_command_picks(const std::string& dir, const std::string& latest, const std::string& kind_words,
                                const std::string& kind) {
  const std::string said =
      fmt::format("{}: the latest committed checkpoint of this {} is step 4: {}", dir, kind_words, latest);

  const json listed = json_in_process("ckpt ls --json " + dir);
  ASSERT_EQ(listed.size(), 2u) << listed.dump(2);
  EXPECT_EQ(listed[0]["step"], 2);
  EXPECT_EQ(listed[1]["step"], 4);
  EXPECT_EQ(listed[1]["path"], latest);
  const json all = json_in_process("ckpt ls --all --json " + dir);
  ASSERT_EQ(all.size(), 3u) << all.dump(2);
  EXPECT_EQ(all[2]["step"], 6);
  EXPECT_FALSE(all[2]["committed"].get<bool>());
  const auto inspected = ckpt_command("inspect " + dir);
  EXPECT_EQ(inspected.status, 0) << inspected.output;
  EXPECT_THAT(inspected.output, HasSubstr(said));
  EXPECT_THAT(inspected.output, HasSubstr(latest + ": stowage format"));
  const json inspected_json = json_in_process("ckpt inspect --json " + dir);  // nothing but the JSON document
  EXPECT_EQ(inspected_json["path"], latest);
  EXPECT_EQ(inspected_json["picked"], (json{{"from", dir}, {"kind", kind}, {"step", 4}}));
  EXPECT_EQ(inspected_json["entries"].size(), 2u);

  const auto verified = ckpt_command("verify " + dir);
  EXPECT_EQ(verified.status, 0) << verified.output;
  EXPECT_THAT(verified.output, HasSubstr(said));
  EXPECT_THAT(verified.output, HasSubstr(latest + ": ok"));
  const json verified_json = json_in_process("ckpt verify --json " + dir);
  EXPECT_TRUE(verified_json["ok"].get<bool>());
  EXPECT_EQ(verified_json["path"], latest);
  EXPECT_EQ(verified_json["picked"]["step"], 4);

  const RunDir out;
  fs::create_directories(out.path);
  const auto exported = ckpt_command("export " + dir + " --out " + (out.path / "a.safetensors").string());
  EXPECT_EQ(exported.status, 0) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr(said));
  const json exported_json =
      json_in_process("ckpt export --json " + dir + " --out " + (out.path / "b.safetensors").string());
  EXPECT_EQ(exported_json["tensors"], 1);
  EXPECT_EQ(exported_json["picked"]["step"], 4);
}

TEST(CkptDirs, EveryCommandTakesADirectoryOfCheckpointsWhateverItsName) {
  const RunDir parent;
  const std::string dir = (parent.path / "saved-models").string();
  const std::string latest = save_steps_two_and_four(dir);
  expect_every_command_picks(dir, latest, "directory of checkpoints", "checkpoints");
}

TEST(CkptDirs, EveryCommandTakesARunDirectory) {
  const RunDir run;
  const std::string latest = save_steps_two_and_four((run.path / "checkpoints").string());
  expect_every_command_picks(run.str(), latest, "run directory", "run");
}

// PyTorch DCP checkpoints in step-<N> directories count as committed (their .metadata
// is written last), as stowage's do.
TEST(CkptDirs, ADirectoryOfPyTorchDcpCheckpointsIsOneToo) {
  const RunDir dir;
  const std::string checkpoint = (dir.path / "step-00000003").string();
  fs::create_directories(dir.path);
  fs::copy(fs::path(test_paths::source_dir()) / "tests/interop/fixtures/torch_dcp/one_rank", checkpoint);
  const json listed = json_in_process("ckpt ls --json " + dir.str());
  ASSERT_EQ(listed.size(), 1u) << listed.dump(2);
  EXPECT_EQ(listed[0]["step"], 3);
  EXPECT_EQ(listed[0]["format"], "pytorch-dcp");
  const json verified = json_in_process("ckpt verify --json " + dir.str());
  EXPECT_TRUE(verified["ok"].get<bool>());
  EXPECT_EQ(verified["path"], checkpoint);
}

TEST(CkptDirs, ADirectoryThatHoldsNoCheckpointIsAnErrorNamingItAndWhatIsTaken) {
  const RunDir scratch;
  const fs::path empty = scratch.path / "empty";
  const fs::path other = scratch.path / "other";
  const fs::path uncommitted = scratch.path / "step-00000009";
  fs::create_directories(empty);
  fs::create_directories(other / "step-x");  // not a step-<N> name
  fs::create_directories(uncommitted);
  std::ofstream(other / "notes.txt") << "no checkpoint here";
  std::ofstream(scratch.path / "file") << "a file";
  const auto expect_error_naming = [](const std::string& args, const fs::path& dir) {
    SCOPED_TRACE(args);
    const auto result = ckpt_command(args);
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_THAT(result.output, HasSubstr("'" + dir.string() + "'"));
    EXPECT_THAT(result.output, HasSubstr("a checkpoint directory"));
    EXPECT_THAT(result.output, HasSubstr("a directory of step-<N> checkpoints"));
    EXPECT_THAT(result.output, HasSubstr("a run directory (one with a checkpoints/ folder)"));
    return result.output;
  };
  // Every command, on an empty directory; inspect on the other kinds of none.
  for (const char* command : {"ls", "inspect", "verify", "export --out x.safetensors"}) {
    expect_error_naming(std::string(command) + " " + empty.string(), empty);
  }
  for (const fs::path& dir : {other, scratch.path / "file", scratch.path / "absent"}) {
    expect_error_naming("inspect " + dir.string(), dir);
  }
  EXPECT_THAT(expect_error_naming("inspect " + uncommitted.string(), uncommitted), HasSubstr("uncommitted checkpoint"));
}

// A run directory before its first checkpoint: nothing to list, nothing to inspect.
TEST(CkptDirs, ARunWithoutCommittedCheckpointsListsNoneAndHasNoneToInspect) {
  const RunDir run;
  fs::create_directories(run.path / "checkpoints" / "step-00000002");  // uncommitted
  EXPECT_TRUE(json_in_process("ckpt ls --json " + run.str()).empty());
  for (const char* command : {"inspect", "verify"}) {
    const auto result = ckpt_command(std::string(command) + " " + run.str());
    EXPECT_EQ(result.status, 1) << result.output;
    EXPECT_THAT(result.output, HasSubstr("the run directory '" + run.str() + "' has no committed checkpoint"));
  }
}

TEST(CkptDirs, ExportAndImportOverExistingOutputNameThePathAndTheOverwriteOption) {
  const RunDir scratch;
  const std::string checkpoint = (scratch.path / "checkpoint").string();
  dcp::save(state_of(1), checkpoint);
  const std::string out = (scratch.path / "model.safetensors").string();
  ASSERT_EQ(ckpt_command("export " + checkpoint + " --out " + out).status, 0);

  const auto exported = ckpt_command("export " + checkpoint + " --out " + out);
  EXPECT_EQ(exported.status, 1) << exported.output;
  EXPECT_THAT(exported.output, HasSubstr("'" + out + "' exists and the option overwrite is off"));
  EXPECT_EQ(ckpt_command("export " + checkpoint + " --out " + out + " --overwrite").status, 0);

  const auto imported = ckpt_command("import " + out + " --out " + checkpoint);
  EXPECT_EQ(imported.status, 1) << imported.output;
  EXPECT_THAT(imported.output,
              HasSubstr("'" + checkpoint + "' already holds a checkpoint and the option overwrite is off"));
  EXPECT_EQ(ckpt_command("import " + out + " --out " + checkpoint + " --overwrite").status, 0);
}

}  // namespace
}  // namespace stowage::testing
