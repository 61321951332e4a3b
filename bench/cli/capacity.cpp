// `stowage bench capacity`: the product's promise, measured. On the simulated device
// (stowage/sim/sim.h) of a fixed capacity, the largest model of `stowage train`'s family
// (its number of blocks, found by search) whose plain training fits (AdamW, no activation
// checkpointing), against the largest that trains with stowage (each block checkpointed,
// AdamW's state swapped to host memory or to disk, or updated on the host, with the
// checkpoints' inputs kept on the device or, last, in host memory). Each size is actually
// trained, for a few steps, by the real command in a child process: a size fits when the run finishes,
// and does not when it exits with the status of a device out of memory. Then, for the
// largest model plain AdamW trains, the device memory each mode needs (issue 41 item 4).
// The simulator's time is no device's time: only sizes are reported.
#include "cli_numbers.h"
#include "bench_commands.h"
#include "program.h"
#include "train_model.h"
#include "train_options.h"
#include "train_run.h"

#include <bench_util.h>
#include <emit.h>

#include <stowage/build_info.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sys/wait.h>

namespace stowage::cli {
namespace {

// `stowage train`'s model and batch, a few steps of each size tried.
TrainOptions capacity_run() {
  TrainOptions run;
  run.steps = 3;
  return run;
}

struct CapacityBenchOptions {
  std::vector<std::string> capacities{"64MiB", "128MiB"};
  // What each size tried trains with (stowage's runs with its swap_times); the search sets
  // the layers, each mode its recompute segments and swap.
  TrainOptions train = capacity_run();
  int64_t max_layers = 128;  // the search stops there
  std::string dir;           // scratch space; empty: the system temp directory
  bool json = false;
};

enum class Mode { kPlain, kStowageHost, kStowageDisk, kStowageHostUpdate, kStowageHostUpdateOffloadedInputs };
constexpr Mode kModes[] = {Mode::kPlain, Mode::kStowageHost, Mode::kStowageDisk, Mode::kStowageHostUpdate,
                           Mode::kStowageHostUpdateOffloadedInputs};

const char* mode_key(Mode mode) {
  switch (mode) {
    case Mode::kPlain:
      return "plain";
    case Mode::kStowageHost:
      return "stowage_host";
    case Mode::kStowageDisk:
      return "stowage_disk";
    case Mode::kStowageHostUpdate:
      return "stowage_host_update";
    case Mode::kStowageHostUpdateOffloadedInputs:
      return "stowage_host_update_offloaded_inputs";
  }
  return "";
}

// `layers` blocks trained for o.train.steps steps on a sim device of `capacity` in `mode`.
TrainRun train_on_sim(const CapacityBenchOptions& o, Mode mode, int64_t layers, const std::string& capacity,
                      const bench::Scratch& scratch) {
  TrainOptions train = o.train;
  train.device = "sim";
  train.run_dir = scratch.sub("run");
  train.ckpt_every = 0;
  train.layers = layers;
  train.log_every = train.steps;
  if (mode == Mode::kPlain) {
    train.swap_times = 0;
    train.recompute_segments = 0;
  } else {
    train.recompute_segments = layers;
    train.swap_to = mode == Mode::kStowageDisk ? "disk:" + scratch.sub("swap") : "host";
    if (mode == Mode::kStowageHostUpdate || mode == Mode::kStowageHostUpdateOffloadedInputs) {
      train.optimizer_update = "host";
    }
    train.offload_checkpoint_inputs = mode == Mode::kStowageHostUpdateOffloadedInputs;
    std::filesystem::create_directories(scratch.sub("swap"));
  }
  // In bytes: --capacity takes every size the tool's byte_size() reads ("1GB" too), the
  // simulator's variable only bytes and binary units.
  return run_train(train, scratch.sub("train.log"),
                   {{"STOWAGE_SIM_CAPACITY", std::to_string(*parse_byte_size(capacity))}});
}

// The model each of stowage's modes must train, against plain AdamW's, in parameters: the
// swap's 3x (issue 28), the update on the host's 8x (issue 41).
constexpr std::pair<const char*, double> kTargetsOverPlain[] = {
    {"stowage_host", 3}, {"stowage_disk", 3}, {"stowage_host_update", 8}, {"stowage_host_update_offloaded_inputs", 8}};

// Whether `layers` blocks train for o.train.steps steps on a sim device of `capacity` in `mode`:
// the run ends with its last step, or exits with kOutOfMemoryStatus. Throws stowage::Error
// when it fails otherwise.
bool trains(const CapacityBenchOptions& o, Mode mode, int64_t layers, const std::string& capacity,
            const bench::Scratch& scratch) {
  const TrainRun run = train_on_sim(o, mode, layers, capacity, scratch);
  if (run.process.succeeded() && run.records.end && run.records.end->last_step == o.train.steps) return true;
  if (WIFEXITED(run.process.status) && WEXITSTATUS(run.process.status) == kOutOfMemoryStatus) return false;
  throw Error(fmt::format("bench capacity: `stowage train --layers {}` ({}) on {} failed, not for device memory: {}",
                          layers, mode_key(mode), capacity, run.process.output_tail()));
}

// The most blocks that train: doubling from one, then bisection. 0 when one does not.
int64_t largest_trainable(const CapacityBenchOptions& o, Mode mode, const std::string& capacity,
                          const bench::Scratch& scratch) {
  int64_t fits = 0;
  int64_t fails = 0;
  for (int64_t layers = 1; layers <= o.max_layers; layers *= 2) {
    if (!trains(o, mode, layers, capacity, scratch)) {
      fails = layers;
      break;
    }
    fits = layers;
  }
  if (fails == 0) return fits;  // capped by max_layers
  while (fails - fits > 1) {
    const int64_t middle = (fits + fails) / 2;
    (trains(o, mode, middle, capacity, scratch) ? fits : fails) = middle;
  }
  return fits;
}

int64_t parameter_count(const CapacityBenchOptions& o, int64_t layers) {
  if (layers == 0) return 0;
  LanguageModelOptions model_options;
  model_options.layers = layers;
  model_options.width = o.train.width;
  model_options.heads = o.train.heads;
  model_options.context = o.train.seq_len;
  const LanguageModel model(model_options);
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  return count;
}

// The device memory each mode needs for one model (`layers` blocks, which every mode
// trains at `capacity`): the parameters (fp32) and the step's peak beyond them (the run's
// peak_step_bytes), in bytes and per parameter.
nlohmann::json device_bytes_per_mode(const CapacityBenchOptions& o, int64_t layers, const std::string& capacity,
                                     const bench::Scratch& scratch) {
  const int64_t parameters = parameter_count(o, layers);
  nlohmann::json out{{"capacity", capacity}, {"layers", layers}, {"parameters", parameters}};
  for (const Mode mode : kModes) {
    const TrainRun run = train_on_sim(o, mode, layers, capacity, scratch);
    if (!run.process.succeeded() || !run.records.end) {
      throw Error(fmt::format("bench capacity: `stowage train --layers {}` ({}) on {} did not finish: {}", layers,
                              mode_key(mode), capacity, run.process.output_tail()));
    }
    const int64_t peak = parameters * 4 + run.records.end->peak_step_bytes;
    out[std::string(mode_key(mode)) + "_peak_device_bytes"] = peak;
    out[std::string(mode_key(mode)) + "_device_bytes_per_parameter"] =
        static_cast<double>(peak) / static_cast<double>(parameters);
  }
  return out;
}

nlohmann::json run_capacity_bench(const CapacityBenchOptions& o) {
  const bench::Scratch scratch(o.dir, "capacity");
  nlohmann::json out = train_options_json(o.train, {"steps", "batch", "seq_len", "width", "heads", "swap_times"});
  out["max_layers"] = o.max_layers;
  out["device"] = "sim (simulated accelerator: sizes only, its time is no device's)";
  out["capacities"] = nlohmann::json::array();
  for (const std::string& capacity : o.capacities) {
    nlohmann::json row{{"capacity", capacity}};
    for (const Mode mode : kModes) {
      const int64_t layers = largest_trainable(o, mode, capacity, scratch);
      row[std::string(mode_key(mode)) + "_layers"] = layers;
      row[std::string(mode_key(mode)) + "_parameters"] = parameter_count(o, layers);
    }
    const double plain = row["plain_parameters"].get<double>();
    for (const auto& [side, target] : kTargetsOverPlain) {
      const double ratio = plain > 0 ? row[std::string(side) + "_parameters"].get<double>() / plain : 0;
      row[std::string(side) + "_over_plain"] = ratio;
      row[std::string(side) + "_over_plain_met"] = ratio >= target;
    }
    out["capacities"].push_back(row);
  }
  // At the largest model plain AdamW trains in the first capacity: every mode trains it.
  const nlohmann::json& first = out["capacities"].front();
  if (first["plain_layers"].get<int64_t>() > 0) {
    out["device_bytes"] =
        device_bytes_per_mode(o, first["plain_layers"].get<int64_t>(), first["capacity"].get<std::string>(), scratch);
  }
  return out;
}

std::string capacity_bench_text(const nlohmann::json& r) {
  std::string out = fmt::format(
      "capacity benchmark on the simulated device: the largest `stowage train` model (width {}, {} heads, batch {} x "
      "{} tokens) that trains {} steps\n",
      r["width"].get<int64_t>(), r["heads"].get<int64_t>(), r["batch"].get<int64_t>(), r["seq_len"].get<int64_t>(),
      r["steps"].get<int64_t>());
  for (const auto& row : r["capacities"]) {
    out += fmt::format("  {}:\n", row["capacity"].get<std::string>());
    const auto line = [&row](const char* who, const std::string& key) {
      return fmt::format("    {:<44} {:4} blocks, {:7.2f}M parameters\n", who, row[key + "_layers"].get<int64_t>(),
                         row[key + "_parameters"].get<double>() / 1e6);
    };
    out += line("plain AdamW, no checkpointing", "plain");
    out += line("stowage: checkpointing + swap to host", "stowage_host");
    out += line("stowage: checkpointing + swap to disk", "stowage_disk");
    out += line("stowage: checkpointing + update on host", "stowage_host_update");
    out += line("stowage: + checkpoints' inputs in host memory", "stowage_host_update_offloaded_inputs");
    for (const auto& [side, target] : kTargetsOverPlain) {
      out += fmt::format("    target {} / plain >= {}: {:.2f} x, {}\n", side, target,
                         row[std::string(side) + "_over_plain"].get<double>(),
                         row[std::string(side) + "_over_plain_met"].get<bool>() ? "met" : "NOT met");
    }
  }
  if (!r.contains("device_bytes")) return out;
  const nlohmann::json& d = r["device_bytes"];
  out += fmt::format(
      "  device memory each mode needs for {:.2f}M parameters ({} blocks, at {}): the parameters and the step's "
      "peak\n",
      d["parameters"].get<double>() / 1e6, d["layers"].get<int64_t>(), d["capacity"].get<std::string>());
  for (const Mode mode : kModes) {
    const std::string key = mode_key(mode);
    out += fmt::format("    {:<44} {:8.2f} MiB, {:6.2f} bytes a parameter\n", key,
                       d[key + "_peak_device_bytes"].get<double>() / (1 << 20),
                       d[key + "_device_bytes_per_parameter"].get<double>());
  }
  return out;
}

}  // namespace

void add_bench_capacity(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "capacity",
      "On the simulated device (sim), the largest model that trains plainly against the largest with stowage");
  auto o = std::make_shared<CapacityBenchOptions>();
  cmd->add_option("--capacity", o->capacities, "the device capacities to search at (e.g. 64MiB)")
      ->check(byte_size())
      ->capture_default_str();
  cmd->add_option("--steps", o->train.steps, "training steps of each size tried")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--batch", o->train.batch, "sequences per step")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--width", o->train.width, "model width")->check(positive_integer<int64_t>())->capture_default_str();
  cmd->add_option("--swap-times", o->train.swap_times, "stowage's optimizer-state batches")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--max-layers", o->max_layers, "the most blocks tried")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--corpus", o->train.corpus, "text file or directory of text files")->capture_default_str();
  cmd->add_option("--dir", o->dir, "scratch directory (default: the system temp directory)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] {
    if (!build_info().with_sim) {
      throw InvalidArgument(fmt::format(
          "bench capacity runs on the simulated device, which needs LibTorch 2.x; this stowage was built against {}",
          build_info().libtorch_version));
    }
    const nlohmann::json result = run_capacity_bench(*o);
    bench::print_result(result, capacity_bench_text(result), o->json);
  });
}

}  // namespace stowage::cli
