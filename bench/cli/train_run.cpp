#include "train_run.h"

#include "launch_ranks.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The stowage program beside this one.
std::string stowage_program() {
  const fs::path program = fs::path(executable_path()).parent_path() / "stowage";
  if (!fs::exists(program)) {
    throw Error(fmt::format("the benchmarks run `stowage train`, and there is no '{}' (build the tool beside them)",
                            program.string()));
  }
  return program.string();
}

}  // namespace

TrainRecords read_train_records(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  TrainRecords records;
  // A checkpoint's line comes before the line of the step in which the loop saw it committed.
  std::vector<int64_t> committed_since_last_step;
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("event")) {
      throw Error(fmt::format("line {} of '{}' is no metrics record: {}", line_number, metrics_path, line));
    }
    const std::string event = record["event"].get<std::string>();
    if (event == "setup") records.activation_checkpointing = record.at("activation_checkpointing").get<std::string>();
    if (event == "checkpoint") committed_since_last_step.push_back(record.at("step").get<int64_t>());
    if (event == "end") records.end = train::parse_run_summary(line);
    if (event != "step") continue;
    records.steps.push_back(train::parse_step_record(line));
    const int64_t step = records.steps.back().step;
    if (step != static_cast<int64_t>(records.steps.size())) {
      throw Error(fmt::format("line {} of '{}' is step {}, expected step {}", line_number, metrics_path, step,
                              records.steps.size()));
    }
    for (const int64_t checkpoint : committed_since_last_step) records.commits_seen.emplace_back(checkpoint, step);
    committed_since_last_step.clear();
  }
  return records;
}

TrainRun run_train(const TrainOptions& options, const std::string& log,
                   const std::map<std::string, std::string>& environment) {
  fs::remove_all(options.run_dir);
  std::vector<std::string> command{stowage_program(), "train"};
  for (std::string& argument : train_arguments(options)) command.push_back(std::move(argument));
  TrainRun run;
  run.process = run_child(command, log, environment);
  const auto remove_run_dir = [&options] {
    std::error_code ignored;
    fs::remove_all(options.run_dir, ignored);
  };
  try {
    run.records = read_train_records((fs::path(options.run_dir) / "metrics.jsonl").string());
  } catch (...) {
    remove_run_dir();
    throw;
  }
  remove_run_dir();
  return run;
}

TrainRecords run_train_or_throw(const TrainOptions& options, const std::string& log, const std::string& what) {
  TrainRun run = run_train(options, log);
  if (!run.process.succeeded() || !run.records.end) {
    throw Error(fmt::format("{} failed (status {}): {}", what, run.process.status, run.process.output_tail()));
  }
  return std::move(run.records);
}

}  // namespace stowage::cli
