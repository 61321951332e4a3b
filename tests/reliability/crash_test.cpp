// Crash consistency: a child process saves generation after generation (crash_child)
// and is killed with SIGKILL at a random moment; after every kill the latest committed
// checkpoint must load and hold exactly the bytes of its generation, no partial
// checkpoint may be visible, and the next save must remove what the killed one left.
// STOWAGE_CRASH_TRIALS sets the number of trials (scripts/crash_trials.sh runs 500),
// STOWAGE_CRASH_SEED the seed.

#include "build_paths.h"
#include "cli/child_signal.h"
#include "dcp/test_util.h"
#include "reliability/crash_child_process.h"
#include "reliability/generations.h"
#include "reliability/report.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include <signal.h>
#include <sys/wait.h>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;

struct Config {
  std::string mode;  // sync, async, async_bg
  bool single_file = true;
  int64_t threads = 1;
  bool overwrite = true;
  std::string name() const {
    return fmt::format("{}/{}/threads={}/{}", mode, single_file ? "file-per-rank" : "file-per-tensor", threads,
                       overwrite ? "overwrite" : "new-dirs");
  }
};

std::vector<Config> all_configs() {
  std::vector<Config> configs;
  for (const char* mode : {"sync", "async", "async_bg"}) {
    for (bool single_file : {true, false}) {
      for (int64_t threads : {1, 3}) {
        for (bool overwrite : {true, false}) configs.push_back(Config{mode, single_file, threads, overwrite});
      }
    }
  }
  return configs;
}

// Files of stowage's naming in `dir` that its committed metadata (if any) does not list.
std::set<std::string> unreferenced_files(const std::string& dir) {
  std::set<std::string> out;
  if (!std::filesystem::is_directory(dir)) return out;
  std::set<std::string> referenced;
  const std::string metadata_path = dcp::testing::metadata_path(dir);
  if (std::filesystem::exists(metadata_path)) {
    for (const std::string& name :
         dcp::decode_metadata(dcp::testing::read_file(metadata_path), metadata_path).files()) {
      referenced.insert(name);
    }
  }
  for (const std::string& name : dcp::testing::list_files(dir)) {
    const bool ours = name.rfind("data-", 0) == 0 || name.rfind(std::string(dcp::kMetadataFileName) + ".tmp-", 0) == 0;
    if (ours && referenced.count(name) == 0) out.insert(dir + "/" + name);
  }
  return out;
}

struct Figures {
  int64_t trials = 0;
  int64_t commits_reported = 0;
  int64_t commits_found_unreported = 0;  // killed between the commit and its report
  int64_t kills_leaving_orphans = 0;
  int64_t orphan_files_left = 0;
  int64_t orphan_files_cleaned = 0;
  int64_t loads_verified = 0;
  int64_t loads_with_no_checkpoint_yet = 0;
};

// One configuration's checkpoint location and what its trials committed so far.
class Series {
 public:
  Series(Config config, const std::string& root) : config_(std::move(config)), root_(root) {}

  std::string dir_of(int64_t generation) const {
    return config_.overwrite ? root_ : fmt::format("{}/gen-{:06d}", root_, generation);
  }

  void run_trial(std::mt19937_64& random, double& mean_save_ms, Figures& figures) {
    const int64_t start = last_committed_ + 1;
    CrashChild child({test_paths::crash_child(), root_, config_.mode, config_.single_file ? "1" : "0",
                      std::to_string(config_.threads), config_.overwrite ? "1" : "0", std::to_string(start)});
    const std::optional<std::string> ready = child.next_line(Clock::now() + std::chrono::seconds(120));
    ASSERT_EQ(ready.value_or("<nothing>"), "ready") << config_.name();
    const double delay_ms = std::uniform_real_distribution<double>(0.0, 3.0 * mean_save_ms)(random);
    const Clock::time_point kill_at = Clock::now() + std::chrono::microseconds(int64_t(delay_ms * 1000));
    Clock::time_point previous = Clock::now();
    const auto on_line = [&](const std::string& line) {
      int64_t generation = -1;
      ASSERT_EQ(std::sscanf(line.c_str(), "committed %ld", &generation), 1) << line;
      ASSERT_EQ(generation, last_committed_ + 1) << config_.name();
      last_committed_ = generation;
      ++figures.commits_reported;
      const Clock::time_point now = Clock::now();
      mean_save_ms = 0.8 * mean_save_ms + 0.2 * std::chrono::duration<double, std::milli>(now - previous).count();
      previous = now;
      // This save started after the kill that left the orphans: it must have removed them.
      for (const std::string& orphan : orphans_) {
        EXPECT_FALSE(std::filesystem::exists(orphan)) << config_.name() << ": orphan survived a save: " << orphan;
      }
      figures.orphan_files_cleaned += static_cast<int64_t>(orphans_.size());
      orphans_.clear();
    };
    while (const std::optional<std::string> line = child.next_line(kill_at)) on_line(*line);
    const int status = child.kill_and_reap();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << config_.name() << ": the child ended on its own (status " << status << ")";
    // Whatever it said before dying counts.
    while (const std::optional<std::string> line = child.next_line(Clock::now())) on_line(*line);
    ++figures.trials;
    verify_after_kill(figures);
  }

  // The latest committed checkpoint loads bit-exact; nothing newer is visible.
  void verify_after_kill(Figures& figures) {
    // A kill right after the commit but before its report leaves one more generation.
    const std::string next_dir = dir_of(last_committed_ + 1);
    if (std::filesystem::exists(dcp::testing::metadata_path(next_dir))) {
      StateDict probe = generation_state(-1);
      dcp::load(probe, next_dir);
      if (probe.at("generation").toInt() == last_committed_ + 1) {
        ++last_committed_;
        ++figures.commits_found_unreported;
      }
    }
    const std::string dir = dir_of(last_committed_);
    StateDict loaded = generation_state(-1);
    if (last_committed_ < 0) {
      EXPECT_FALSE(std::filesystem::exists(dcp::testing::metadata_path(dir))) << config_.name();
      try {
        dcp::load(loaded, dir);
        ADD_FAILURE() << config_.name() << ": a checkpoint is visible before any commit";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("holds no checkpoint"), std::string::npos) << e.what();
      }
      ++figures.loads_with_no_checkpoint_yet;
    } else {
      try {
        dcp::load(loaded, dir);
        EXPECT_EQ(compare_to_generation(loaded, last_committed_), "") << config_.name();
        ++figures.loads_verified;
      } catch (const std::exception& e) {
        ADD_FAILURE() << config_.name() << ": the latest committed checkpoint does not load: " << e.what();
      }
    }
    if (!config_.overwrite) {
      // The directory of the next generation holds at most a partial save, never a checkpoint.
      EXPECT_FALSE(std::filesystem::exists(dcp::testing::metadata_path(dir_of(last_committed_ + 1))));
    }
    // New orphans only: those of an earlier kill stay until a save commits.
    int64_t new_orphans = 0;
    for (const std::string& file : unreferenced_files(dir_of(config_.overwrite ? 0 : last_committed_ + 1))) {
      new_orphans += orphans_.insert(file).second ? 1 : 0;
    }
    if (new_orphans > 0) ++figures.kills_leaving_orphans;
    figures.orphan_files_left += new_orphans;
  }

  // One more save in this process: it must remove every orphan still pending.
  void finish(Figures& figures) {
    const int64_t generation = last_committed_ + 1;
    dcp::FileSystemWriter writer(dir_of(generation), dcp::FileSystemWriterOptions()
                                                         .single_file_per_rank(config_.single_file)
                                                         .thread_count(config_.threads)
                                                         .overwrite(config_.overwrite));
    dcp::save(generation_state(generation), writer);
    for (const std::string& orphan : orphans_) EXPECT_FALSE(std::filesystem::exists(orphan)) << orphan;
    figures.orphan_files_cleaned += static_cast<int64_t>(orphans_.size());
    orphans_.clear();
    EXPECT_TRUE(unreferenced_files(dir_of(generation)).empty()) << config_.name();
  }

 private:
  Config config_;
  std::string root_;
  int64_t last_committed_ = -1;
  std::set<std::string> orphans_;
};

TEST(CrashConsistency, KilledSavesLeaveTheLatestCommittedCheckpointWhole) {
  const int64_t trials = count_from_env("STOWAGE_CRASH_TRIALS", 24);
  const uint64_t seed = static_cast<uint64_t>(count_from_env("STOWAGE_CRASH_SEED", 8));
  std::mt19937_64 random(seed);
  const ScratchDir scratch;
  const std::vector<Config> configs = all_configs();
  std::vector<Series> series;
  for (size_t i = 0; i < configs.size(); ++i) {
    series.emplace_back(configs[i], scratch.sub(fmt::format("config-{}", i)));
  }
  Figures figures;
  double mean_save_ms = 150.0;
  for (int64_t trial = 0; trial < trials; ++trial) {
    series[static_cast<size_t>(trial) % series.size()].run_trial(random, mean_save_ms, figures);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (Series& s : series) s.finish(figures);
  EXPECT_GT(figures.commits_reported, 0);
  EXPECT_GT(figures.loads_verified, 0);
  record_figure("crash.seed", static_cast<int64_t>(seed));
  record_figure("crash.trials", figures.trials);
  record_figure("crash.configurations", static_cast<int64_t>(configs.size()));
  record_figure("crash.commits_reported", figures.commits_reported);
  record_figure("crash.commits_found_unreported", figures.commits_found_unreported);
  record_figure("crash.loads_verified_bit_exact", figures.loads_verified);
  record_figure("crash.kills_before_first_commit", figures.loads_with_no_checkpoint_yet);
  record_figure("crash.kills_leaving_orphans", figures.kills_leaving_orphans);
  record_figure("crash.orphan_files_left", figures.orphan_files_left);
  record_figure("crash.orphan_files_cleaned", figures.orphan_files_cleaned);
  record_figure("crash.mean_save_ms", static_cast<int64_t>(mean_save_ms));
}

}  // namespace
}  // namespace stowage::reliability
