// End-to-end runs of `stowage train` as real processes: exact resume, also after a
// SIGKILL in the middle of an asynchronous checkpoint, and the ckpt subcommands.
#include "cli/child_signal.h"
#include "cli/train_util.h"

#include <gmock/gmock.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace stowage::testing {
namespace {

// Flips one byte inside the bytes of `chunk` (as `ckpt inspect --json` lists it) of
// the checkpoint in `dir`.
void flip_a_byte_of(const std::string& dir, const json& chunk) {
  FILE* f = std::fopen((fs::path(dir) / chunk["file"].get<std::string>()).c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, chunk["offset"].get<long>() + 3, SEEK_SET);
  const int byte = std::fgetc(f);
  std::fseek(f, chunk["offset"].get<long>() + 3, SEEK_SET);
  std::fputc(byte ^ 0x40, f);
  std::fclose(f);
}

TEST(Train, ResumedRunEndsBitIdenticalToAnUninterruptedOne) {
  RunDir straight, resumed;
  const auto a = train(straight, "--steps 12 --ckpt-every 6");
  ASSERT_EQ(a.status, 0) << a.output;
  const auto b1 = train(resumed, "--steps 6 --ckpt-every 6");
  ASSERT_EQ(b1.status, 0) << b1.output;
  const auto b2 = train(resumed, "--steps 12 --ckpt-every 6 --resume");
  ASSERT_EQ(b2.status, 0) << b2.output;
  EXPECT_NE(b2.output.find("resume: from " + step_dir(resumed, 6) + " (step 6)"), std::string::npos) << b2.output;
  // Model, optimizer (swapped state included), RNG states and data position.
  expect_same_checkpoint(step_dir(straight, 12), step_dir(resumed, 12));
  // And the last step logged the same loss: same data, same numbers.
  const auto last_loss = [](const std::string& output) {
    const size_t at = output.find("step 12/12 loss ");
    return at == std::string::npos ? std::string("missing") : output.substr(at, output.find(' ', at + 16) - at);
  };
  EXPECT_NE(last_loss(a.output), "missing") << a.output;
  EXPECT_EQ(last_loss(a.output), last_loss(b2.output));
}

// --resume-from another run's checkpoint continues it as --resume continues its own:
// model, optimizer, RNG states and data position.
TEST(Train, ResumingFromAnotherRunsCheckpointEndsBitIdenticalToAnUninterruptedOne) {
  RunDir straight, first, second;
  ASSERT_EQ(train(straight, "--steps 8 --ckpt-every 4").status, 0);
  ASSERT_EQ(train(first, "--steps 4 --ckpt-every 4").status, 0);
  const auto continued = train(second, "--steps 8 --ckpt-every 4 --resume-from " + step_dir(first, 4));
  ASSERT_EQ(continued.status, 0) << continued.output;
  EXPECT_NE(continued.output.find("(model, optimizer and progress) at step 4"), std::string::npos) << continued.output;
  expect_same_checkpoint(step_dir(straight, 8), step_dir(second, 8));
}

TEST(Train, PlainOptimizerWithoutRecomputeResumesExactlyToo) {
  RunDir straight, resumed;
  const std::string plain = " --swap-times 0 --recompute-segments 0 --ckpt-every 4";
  ASSERT_EQ(train(straight, "--steps 8" + plain).status, 0);
  ASSERT_EQ(train(resumed, "--steps 4" + plain).status, 0);
  ASSERT_EQ(train(resumed, "--steps 8 --resume" + plain).status, 0);
  expect_same_checkpoint(step_dir(straight, 8), step_dir(resumed, 8));
}

TEST(Train, KilledDuringAnAsyncSaveResumesFromTheLastCommittedCheckpoint) {
  RunDir straight, killed;
  constexpr int kSteps = 40;
  ASSERT_EQ(train(straight, "--steps 40 --ckpt-every 2 --keep 50").status, 0);

  // Start the run and SIGKILL it the moment a checkpoint directory holds data files
  // but no committed metadata: the save is in flight.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string command = stowage_binary() + " train --run-dir " + killed.str() + kSmall +
                                " --steps 40 --ckpt-every 2 --keep 50 > /dev/null 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int caught_step = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (caught_step < 0 && std::chrono::steady_clock::now() < deadline) {
    for (int step = 2; step <= kSteps && caught_step < 0; step += 2) {
      const fs::path dir = step_dir(killed, step);
      std::error_code error;
      if (!fs::is_directory(dir, error) || fs::exists(dir / ".metadata.json", error)) continue;
      for (const auto& file : fs::directory_iterator(dir, error)) {
        if (file.path().extension() == ".data") {
          ASSERT_TRUE(signal_descendant(pid, SIGKILL));
          caught_step = step;
          break;
        }
      }
    }
    int status = 0;
    if (caught_step < 0 && waitpid(pid, &status, WNOHANG) == pid) break;  // finished first
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_GT(caught_step, 0) << "the run ended before a save was caught in flight";
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  // The half-written checkpoint is invisible; every committed one verifies. (The save can
  // commit between the look and the kill: its checkpoint is then a committed one.)
  const bool committed_before_the_kill = fs::exists(fs::path(step_dir(killed, caught_step)) / ".metadata.json");
  const json listed = run_json("ckpt ls --json " + killed.str());
  for (const auto& row : listed) {
    EXPECT_TRUE(row["committed"].get<bool>());
    if (!committed_before_the_kill) EXPECT_NE(row["step"].get<int>(), caught_step);
    EXPECT_TRUE(run_json("ckpt verify --json " + row["path"].get<std::string>())["ok"].get<bool>());
  }

  const auto resumed = train(killed, "--steps 40 --ckpt-every 2 --keep 50 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  expect_same_checkpoint(step_dir(straight, kSteps), step_dir(killed, kSteps));
}

TEST(Ckpt, VerifyReportsTheFirstCorruptEntryAndFails) {
  RunDir run;
  ASSERT_EQ(train(run, "--steps 2 --ckpt-every 2").status, 0);
  const std::string checkpoint = step_dir(run, 2);
  const json inspected = run_json("ckpt inspect --json " + checkpoint);
  const json& first = inspected["entries"][0];
  ASSERT_TRUE(first.contains("chunks"));
  const auto& chunk = first["chunks"][0];
  // Flip one byte inside the first tensor's bytes.
  flip_a_byte_of(checkpoint, chunk);
  const auto result = run_command(stowage_binary() + " ckpt verify " + checkpoint);
  EXPECT_EQ(result.status, 2) << result.output;
  EXPECT_NE(result.output.find(first["key"].get<std::string>()), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("corrupt"), std::string::npos) << result.output;
}

// Checkpointing one part of each block (selective recompute) trains as plain training
// does, bit for bit.
TEST(Train, SelectiveRecomputeTrainsBitIdenticallyToNoRecompute) {
  RunDir plain, attention_core, mlp;
  const std::string common = "--steps 4 --ckpt-every 4 --swap-times 0 --recompute-segments 0";
  ASSERT_EQ(train(plain, common).status, 0);
  const auto selective = train(attention_core, common + " --selective-recompute attention-core");
  ASSERT_EQ(selective.status, 0) << selective.output;
  EXPECT_THAT(selective.output, ::testing::HasSubstr("activation checkpointing: selective (attention-core)"));
  ASSERT_EQ(train(mlp, common + " --selective-recompute mlp").status, 0);
  expect_same_checkpoint(step_dir(plain, 4), step_dir(attention_core, 4));
  expect_same_checkpoint(step_dir(plain, 4), step_dir(mlp, 4));
}

// The activation peak of each step the run's metrics.jsonl logged.
std::vector<int64_t> activation_peaks(const RunDir& dir) {
  std::ifstream file(dir.path / "metrics.jsonl");
  std::vector<int64_t> peaks;
  for (std::string line; std::getline(file, line);) {
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("event", "") == "step") {
      peaks.push_back(record["peak_activation_bytes"].get<int64_t>());
    }
  }
  return peaks;
}

// A budget below training without checkpointing: every step's activation peak within it,
// and the weights those without checkpointing reach, bit for bit.
TEST(Train, AnActivationBudgetHoldsAtEveryStepAndTrainsBitIdentically) {
  RunDir plain, budgeted;
  const std::string common = "--steps 4 --ckpt-every 4 --swap-times 0 --recompute-segments 0";
  ASSERT_EQ(train(plain, common).status, 0);
  const std::vector<int64_t> unplanned = activation_peaks(plain);
  ASSERT_EQ(unplanned.size(), 4U);
  const int64_t budget = *std::min_element(unplanned.begin(), unplanned.end()) * 3 / 4;
  const auto result = train(budgeted, common + " --activation-budget " + std::to_string(budget));
  ASSERT_EQ(result.status, 0) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("for a budget of"));
  const std::vector<int64_t> peaks = activation_peaks(budgeted);
  ASSERT_EQ(peaks.size(), 4U);
  for (const int64_t peak : peaks) EXPECT_LE(peak, budget);
  expect_same_checkpoint(step_dir(plain, 4), step_dir(budgeted, 4));
}

// Bad options are found before anything is created: the run directory stays absent.
TEST(Train, BadInputsLeaveNoRunDirectoryBehind) {
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--corpus /nonexistent/corpus.txt", "/nonexistent/corpus.txt"},
           {"--recompute-segments 3", "--recompute-segments 3"},  // kSmall has 2 blocks: 3 segments are too many
           {"--recompute-segments 1 --selective-recompute mlp",
            "pass --recompute-segments 0 with --selective-recompute"},
           {"--recompute-segments 0 --offload-checkpoint-inputs", "but none are made"},
           {"--activation-budget 64MiB --recompute-segments 2", "picks what to recompute and offload itself"},
           {"--activation-budget 1KiB", "is below the smallest activation peak any plan"},
           {"--activation-budget 0", "--activation-budget"}}) {
    SCOPED_TRACE(args);
    RunDir dir;
    const auto result = train(dir, "--steps 2 " + args);
    EXPECT_NE(result.status, 0) << result.output;
    EXPECT_THAT(result.output, ::testing::HasSubstr(message));
    EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
  }
}

TEST(Train, ADeviceThatIsNoneOrMissingHereIsAClearErrorBeforeAnythingIsCreated) {
  for (const auto& [device, message] : std::vector<std::pair<std::string, std::string>>{
           {"gpu0", "--device 'gpu0' is not a device"},
           {"cuda:7", "--device 'cuda:7': this "},  // "built without CUDA", or "machine has N CUDA devices"
           {"mps", "--device 'mps': stowage runs on the CPU, on CUDA devices, or on the simulated device sim"}}) {
    SCOPED_TRACE(device);
    RunDir dir;
    const auto result = train(dir, "--steps 2 --device " + device);
    EXPECT_NE(result.status, 0) << result.output;
    EXPECT_THAT(result.output, ::testing::HasSubstr(message));
    EXPECT_FALSE(fs::exists(dir.path)) << "created " << dir.str();
  }
}

// --device cuda is each rank's cuda:LOCAL_RANK, one GPU per rank as torchrun numbers a
// node's ranks: here the device an error names, on a machine without one.
TEST(Train, CudaWithoutAnIndexIsTheLocalRanksDevice) {
  RunDir dir;
  const auto result =
      run_command("LOCAL_RANK=3 " + stowage_binary() + " train --run-dir " + dir.str() + kSmall + " --device cuda");
  EXPECT_NE(result.status, 0) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("--device 'cuda:3': this ")) << result.output;
}

// A run directory that cannot be created (here: below a regular file) is an error
// naming it, not an uncaught std::filesystem exception that aborts the process.
TEST(Train, ARunDirectoryThatCannotBeCreatedIsAClearError) {
  RunDir file;
  std::ofstream(file.path) << "not a directory";
  const std::string run_dir = (file.path / "run").string();
  const auto result = run_command(stowage_binary() + " train --run-dir " + run_dir + kSmall + " --steps 1");
  EXPECT_EQ(result.status, 1) << result.output;
  EXPECT_THAT(result.output, ::testing::HasSubstr("stowage: "));
  EXPECT_THAT(result.output, ::testing::HasSubstr(run_dir));
  EXPECT_THAT(result.output, ::testing::Not(::testing::HasSubstr("terminate called")));
}

// metrics.jsonl gets each record as it is written: a run killed with SIGKILL has every
// step it reported in the file, each line whole.
TEST(Train, MetricsOfAKilledRunHoldEveryReportedStep) {
  RunDir dir;
  constexpr int kKillAfter = 5;
  // The shell prints its pid, then exec keeps it for stowage.
  FILE* out = popen(("echo $$; exec " + stowage_binary() + " train --run-dir " + dir.str() +
                     " --layers 2 --width 64 --heads 2 --batch 8 --seq-len 32 --threads 1 --steps 100000 "
                     "--ckpt-every 0 --log-every 1 2>&1")
                        .c_str(),
                    "r");
  ASSERT_NE(out, nullptr);
  char line[4096];
  ASSERT_NE(fgets(line, sizeof(line), out), nullptr);
  const pid_t pid = static_cast<pid_t>(std::stol(line));
  const std::string reported = "step " + std::to_string(kKillAfter) + "/";
  std::string output;
  while (fgets(line, sizeof(line), out) != nullptr) {
    output += line;
    if (std::string(line).rfind(reported, 0) == 0) {
      ASSERT_TRUE(signal_descendant(pid, SIGKILL)) << output;
      break;
    }
  }
  const int status = pclose(out);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << output;

  std::ifstream metrics(dir.path / "metrics.jsonl");
  std::vector<int> steps;
  for (std::string record; std::getline(metrics, record);) {
    const json parsed = json::parse(record);  // throws on a torn line
    if (parsed["event"] == "step") steps.push_back(parsed["step"].get<int>());
  }
  ASSERT_GE(steps.size(), static_cast<size_t>(kKillAfter)) << output;
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<int>(i) + 1);
}

// The metrics keep the host buffers of checkpoint staging apart from the swapped
// optimizer state's: no staging before the first checkpoint.
TEST(Train, MetricsSeparateCheckpointStagingFromTheSwappedOptimizerState) {
  RunDir dir;
  const auto result = train(dir, "--steps 5 --ckpt-every 3 --swap-times 2");
  ASSERT_EQ(result.status, 0) << result.output;
  std::ifstream metrics(dir.path / "metrics.jsonl");
  int64_t steps = 0;
  for (std::string line; std::getline(metrics, line);) {
    const json record = json::parse(line);
    if (record["event"] != "step") continue;
    ++steps;
    const auto step = record["step"].get<int64_t>();
    EXPECT_GT(record["optimizer_host_bytes"].get<int64_t>(), 0) << line;
    if (step <= 3) {
      EXPECT_EQ(record["checkpoint_host_bytes"].get<int64_t>(), 0) << line;  // saved after step 3's record
    } else {
      EXPECT_GT(record["checkpoint_host_bytes"].get<int64_t>(), 0) << line;
    }
    EXPECT_GT(record["gradient_bytes"].get<int64_t>(), 0) << line;
    EXPECT_GE(record["peak_step_bytes"].get<int64_t>(), record["peak_activation_bytes"].get<int64_t>()) << line;
  }
  EXPECT_EQ(steps, 5);
}

TEST(Ckpt, LsRejectsADirectoryThatIsNoRun) {
  RunDir empty;
  fs::create_directories(empty.path);
  const auto result = run_command(stowage_binary() + " ckpt ls " + empty.str());
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.output.find("'" + empty.str() + "' holds no checkpoint: expected a checkpoint directory"),
            std::string::npos)
      << result.output;
}

// --resume past a committed checkpoint that cannot be read: the run says it skipped it,
// resumes from the one before, and finishes (saving that step anew).
TEST(Train, ResumeSkipsACorruptNewestCheckpointForThePreviousOne) {
  RunDir run;
  ASSERT_EQ(train(run, "--steps 4 --ckpt-every 2").status, 0);
  // Flip one byte inside a model tensor's chunk of step 4.
  const std::string newest = step_dir(run, 4);
  const auto saved = fingerprint(newest);
  const json inspected = run_json("ckpt inspect --json " + newest);
  const auto entry = std::find_if(inspected["entries"].begin(), inspected["entries"].end(), [](const json& e) {
    return e.contains("chunks") && e["key"].get<std::string>().rfind("model.", 0) == 0;
  });
  ASSERT_NE(entry, inspected["entries"].end()) << inspected.dump(2);
  const json& chunk = (*entry)["chunks"][0];
  flip_a_byte_of(newest, chunk);

  const auto resumed = train(run, "--steps 4 --ckpt-every 2 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, ::testing::HasSubstr("resume: skipped " + newest + ": ")) << resumed.output;
  EXPECT_THAT(resumed.output, ::testing::HasSubstr("resume: from " + step_dir(run, 2) + " (step 2)"));
  EXPECT_THAT(resumed.output, ::testing::HasSubstr("done: steps 3-4"));
  // Step 4 was saved again, whole, and as the first run saved it: the resume was exact.
  EXPECT_TRUE(run_json("ckpt verify --json " + run.str())["ok"].get<bool>());
  EXPECT_EQ(fingerprint(newest), saved);
}

}  // namespace
}  // namespace stowage::testing
