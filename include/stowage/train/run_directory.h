#pragma once

// A run directory belongs to one training run: <run_dir>/run.json records the
// configuration the run started with (what shapes its model and its data), and a
// resume that changes any of it is refused, naming the setting, unless allowed. A fresh
// run into a directory that holds another run's files (run.json, metrics.jsonl, or
// checkpoints) is refused: it would mix the two runs' metrics and checkpoints, and a
// later resume would continue the old one.
//
// run.json: {"format": 1, "config": {"<name>": "<value>", ...}}, written whole (a
// temporary file renamed over it).

#include <map>
#include <optional>
#include <string>

namespace stowage::train {

// Names and values of the settings that shape a run's model and data (e.g. "--heads" →
// "2"): a resume must keep each.
using RunConfig = std::map<std::string, std::string>;

// Where a run's checkpoints go: <run_dir>/checkpoints (dcp::kRunCheckpointsFolder, which
// dcp::describe_directory recognises).
std::string checkpoints_directory(const std::string& run_dir);

// The configuration recorded in `run_dir`, or nothing when it has no run.json. Throws
// CorruptionError naming the file when it is not one this code wrote, IoError when it
// cannot be read.
std::optional<RunConfig> read_run_config(const std::string& run_dir);

// What `run_dir` holds of a run, to tell the user: "run.json, metrics.jsonl and 2
// committed checkpoints (the latest of step 20)"; empty when it holds none of these.
std::string describe_run(const std::string& run_dir);

// Checks that a run with `config` may use `run_dir`; reads only.
// Fresh (resuming false): throws InvalidArgument when describe_run() finds anything,
// naming what and the way out (resume, or another directory).
// Resuming: a recorded configuration that differs from `config` throws InvalidArgument
// naming each differing setting with both values, unless `allow_change`.
void check_run_directory(const std::string& run_dir, const RunConfig& config, bool resuming, bool allow_change);

// Creates `run_dir` if needed and records `config` in its run.json. Throws IoError.
// REQUIRES: check_run_directory() passed; one process of the job (rank 0) calls it.
void write_run_config(const std::string& run_dir, const RunConfig& config);

}  // namespace stowage::train
