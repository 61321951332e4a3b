#pragma once

// Runs of `stowage train` in temporary run directories, and comparisons of their
// checkpoints through `stowage ckpt inspect --json`.

#include "cli/cli_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace stowage::testing {
namespace fs = std::filesystem;
using nlohmann::json;

// A small model, so that each run takes seconds; every capability stays on.
inline const std::string kSmall =
    " --layers 2 --width 64 --heads 2 --batch 8 --seq-len 32 --threads 1 --log-every 1000";
// The same, its global batch split over 3 or 6 ranks.
inline const std::string kSmallForThreeRanks =
    " --layers 2 --width 64 --heads 2 --batch 6 --seq-len 32 --threads 1 --log-every 1000";

struct RunDir {
  RunDir()
      : path(fs::temp_directory_path() / ("stowage-train-" + std::to_string(getpid()) + "-" + std::to_string(++n))) {
    fs::remove_all(path);
  }
  ~RunDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
  fs::path path;
  static inline int n = 0;
};

inline CommandResult train(const RunDir& dir, const std::string& args, const std::string& model = kSmall) {
  return run_command(stowage_binary() + " train --run-dir " + dir.str() + model + " " + args);
}

inline json run_json(const std::string& args) {
  const auto result = run_command(stowage_binary() + " " + args);
  EXPECT_EQ(result.status, 0) << args << "\n" << result.output;
  return json::parse(result.output);
}

// Every entry of the checkpoint: tensors by their chunks' checksums, values by value.
inline std::map<std::string, std::string> fingerprint(const std::string& checkpoint) {
  std::map<std::string, std::string> out;
  const json inspected = run_json("ckpt inspect --json " + checkpoint);
  for (const auto& entry : inspected["entries"]) {
    json content = entry.contains("chunks") ? json::array() : entry["value"];
    if (entry.contains("chunks")) {
      for (const auto& chunk : entry["chunks"]) {  // the box and the bytes' checksum, not where they lie
        content.push_back({chunk["offsets"], chunk["sizes"], chunk["length"], chunk["checksum"]});
      }
    }
    out[entry["key"].get<std::string>()] = content.dump();
  }
  return out;
}

// The last step record of the run's metrics.jsonl (null: none).
inline json last_step_record(const RunDir& dir) {
  std::ifstream file(dir.path / "metrics.jsonl");
  json last;
  for (std::string line; std::getline(file, line);) {
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_object() && record.value("event", "") == "step") last = record;
  }
  return last;
}

// The highest step the run's metrics.jsonl has logged so far (0: none).
inline int64_t logged_step(const RunDir& dir) {
  const json last = last_step_record(dir);
  return last.is_null() ? 0 : last["step"].get<int64_t>();
}

inline std::string step_dir(const RunDir& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d", step);
  return (dir.path / "checkpoints" / name).string();
}

inline void expect_same_checkpoint(const std::string& a, const std::string& b) {
  const auto fa = fingerprint(a);
  const auto fb = fingerprint(b);
  ASSERT_EQ(fa.size(), fb.size());
  ASSERT_GT(fa.size(), 20u);
  for (const auto& [key, value] : fa) {
    ASSERT_TRUE(fb.count(key)) << key;
    EXPECT_EQ(value, fb.at(key)) << key;
  }
}

}  // namespace stowage::testing
