#include "bench_commands.h"
#include "launch_ranks.h"

#include <emit.h>
#include <memory_timeline.h>
#include <python_peer.h>
#include <report.h>

#include <stowage/build_info.h>
#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stowage::cli {
namespace {

using nlohmann::json;

// What `stowage bench` runs with no benchmark named.
struct RunAllOptions {
  bool json = false;
  bool peer = false;   // each benchmark that has a Python peer runs with it
  bool quick = false;  // small sizes: to see the table or the report work, not for figures
  std::string report_dir;
  std::string from;  // instead of running: the report of this saved JSON
};

// Each figure's JSON value, null when absent: a figure whose peer did not run.
json figure_of(const json& source, const std::string& key) {
  return source.is_object() && source.contains(key) ? source[key] : json();
}

json ratio(const json& numerator, const json& denominator) {
  if (!numerator.is_number() || !denominator.is_number() || denominator.get<double>() == 0) return nullptr;
  return numerator.get<double>() / denominator.get<double>();
}

// Adds a row of the table of targets when `value` is a number: a measured ratio, met when it
// is `relation` ("<=" or ">=") `limit`.
void add_row(bench::Table& rows, const std::string& benchmark, const std::string& figure, const json& value,
             const std::string& relation, double limit) {
  if (!value.is_number()) return;
  const double v = value.get<double>();
  const bool met = relation == "<=" ? v <= limit : v >= limit;
  rows.add(bench::Row()
               .field("benchmark", benchmark)
               .field("figure", figure)
               .field("value", v, "{:.3f}")
               .field("target", fmt::format("{} {:.3g}", relation, limit))
               .json("met", met)
               .text("", bench::met_text(met)));
}

void add_dcp_rows(bench::Table& rows, const json& r) {
  const auto f = [&](const char* key) { return figure_of(r, key); };
  add_row(rows, "dcp", "stage_cached / memcpy", ratio(f("stage_cached_gbps"), f("memcpy_gbps")), ">=", 0.8);
  add_row(rows, "dcp", "save / raw_write", ratio(f("save_gbps"), f("raw_write_gbps")), ">=", 0.9);
  add_row(rows, "dcp", "save / torch_save", ratio(f("save_gbps"), f("torch_save_gbps")), ">=", 2);
  add_row(rows, "dcp", "load / torch_load", ratio(f("load_gbps"), f("torch_load_gbps")), ">=", 2);
  add_row(rows, "dcp", "async_block / stage", ratio(f("async_block_s"), f("stage_s")), "<=", 1.1);
  // Against PyTorch DCP, when its peer ran (issue 15).
  add_row(rows, "dcp", "save / pytorch dcp, 2 threads", ratio(f("save_gbps"), f("pytorch_dcp_save_two_threads_gbps")),
          ">=", 2);
  add_row(rows, "dcp", "save / pytorch dcp, 1 thread", ratio(f("save_one_thread_gbps"), f("pytorch_dcp_save_gbps")),
          ">=", 2);
  add_row(rows, "dcp", "load / pytorch dcp", ratio(f("load_gbps"), f("pytorch_dcp_load_gbps")), ">=", 2);
  add_row(rows, "dcp", "async_block DefaultStager / pytorch dcp",
          ratio(f("async_block_default_stager_s"), f("pytorch_dcp_async_block_s")), "<=", 1);
  add_row(rows, "dcp", "save peak host / pytorch dcp",
          ratio(f("save_peak_host_bytes"), f("pytorch_dcp_peak_host_bytes")), "<=", 1);
}

// Against PyTorch, when its peer ran (issue 15): the ratios the benchmark computes on
// like-for-like figures ("step_over_pytorch[_nonreentrant]", "peak_over_pytorch[...]").
// Checkpointed runs must be no slower at no more memory than either of PyTorch's
// checkpoints; the plain step, the same work in both, no slower.
void add_activation_peer_rows(bench::Table& rows, const json& r) {
  add_row(rows, "activation", "plain step / pytorch", figure_of(r, "plain_step_over_pytorch"), "<=", 1);
  for (const json& run : r.value("runs", json::array())) {
    const int64_t segments = run.value("segments", int64_t(0));
    for (const std::string figure : {"step", "peak"}) {
      for (const auto& [variant, name] : {std::pair{"", "reentrant"}, std::pair{"_nonreentrant", "non-reentrant"}}) {
        add_row(rows, "activation", fmt::format("{} / pytorch {}, {} segments", figure, name, segments),
                figure_of(run, figure + "_over_pytorch" + variant), "<=", 1);
      }
    }
  }
}

void add_activation_rows(bench::Table& rows, const json& r) {
  const std::string at = fmt::format("at {} segments", r.value("sqrt_segments", 0));
  add_row(rows, "activation", "activations / plain " + at, figure_of(r, "activation_ratio"), "<=", 1.0 / 3);
  add_row(rows, "activation", "step / plain " + at, figure_of(r, "step_ratio"), "<=", 1.4);
  add_activation_peer_rows(rows, r);
}

void add_swap_rows(bench::Table& rows, const json& r) {
  for (const json& run : r.value("runs", json::array())) {
    const int64_t times = run.value("swap_times", int64_t(1));
    const double limit = (2.0 / static_cast<double>(times) + 0.05) * r.value("plain_state_bytes", 0.0);
    add_row(rows, "swap", fmt::format("step / plain, swap_times {}", times),
            ratio(figure_of(run, "step_s"), figure_of(r, "plain_step_s")), "<=", 1.5);
    add_row(rows, "swap", fmt::format("peak resident / limit, swap_times {}", times),
            ratio(figure_of(run, "peak_resident_during_step_bytes"), limit), "<=", 1);
  }
}

// The promise (issue 28): at each capacity of the simulated device, stowage trains >= 3x the
// parameters plain training does.
void add_capacity_rows(bench::Table& rows, const json& r) {
  if (!r.is_object() || !r.contains("capacities")) return;
  for (const json& row : r["capacities"]) {
    const std::string capacity = row["capacity"].get<std::string>();
    add_row(rows, "capacity", "parameters, stowage (host) / plain, " + capacity,
            figure_of(row, "stowage_host_over_plain"), ">=", 3);
    add_row(rows, "capacity", "parameters, stowage (disk) / plain, " + capacity,
            figure_of(row, "stowage_disk_over_plain"), ">=", 3);
  }
}

// The goals `stowage bench activation --train-model` judged (issue 26), on its device.
void add_activation_train_rows(bench::Table& rows, const json& r) {
  const std::string device = r.value("device", std::string("?"));
  for (const json& goal : r.value("goals", json::array())) {
    add_row(
        rows, "activation",
        fmt::format("{}, seq {} ({})", goal.value("goal", std::string()), goal.value("seq_len", int64_t(0)), device),
        figure_of(goal, "value"), "<=", goal.value("limit", 0.0));
  }
}

void add_train_rows(bench::Table& rows, const json& r) {
  add_row(rows, "train", "tokens/s / pytorch's",
          ratio(figure_of(r, "stowage_tokens_per_s"), figure_of(r, "pytorch_tokens_per_s")), ">=", 1);
  // Issue 37's figures, each judged by the limit the benchmark reports beside it.
  for (const auto& [figure, key] :
       {std::pair{"far step / no checkpoint's", "stowage_far_over_no_checkpoint"},
        std::pair{"step speed changed by the first checkpoint", "stowage_first_checkpoint_change"}}) {
    const json limit = figure_of(r, std::string(key) + "_limit");
    if (limit.is_number()) add_row(rows, "train", figure, figure_of(r, key), "<=", limit.get<double>());
  }
}

// Issue 40: the memory tier against storage, on the same state in the same run.
void add_memory_tier_rows(bench::Table& rows, const json& r) {
  add_row(rows, "memory-tier", "save throughput to commit, memory tier / storage",
          figure_of(r, "memory_over_storage_save"), ">=", 5);
  add_row(rows, "memory-tier", "the same, with the replicas committed", figure_of(r, "replicated_over_storage_save"),
          ">=", 5);
  add_row(rows, "memory-tier", "restore, storage cold / own memory", figure_of(r, "storage_over_memory_restore"),
          ">=", 5);
  add_row(rows, "memory-tier", "restore, storage cold / peer replica", figure_of(r, "storage_over_replica_restore"),
          ">=", 5);
}

// --quick's sizes of each benchmark: seconds each, to try the table or the report.
std::vector<std::string> quick_args(const std::string& name) {
  if (name == "dcp") return {"--size-mib", "8"};
  if (name == "activation") {
    return {"--blocks", "4", "--width", "64", "--batch", "256", "--repetitions", "1", "--segments", "2"};
  }
  if (name == "swap") {
    return {"--params", "1048576", "--tensors", "16", "--warmup-steps", "0", "--steps", "1", "--cpu-cache-mib", "64"};
  }
  if (name == "activation_train") {
    return {"--train-layers", "2", "--train-width",  "32", "--seq-lens",      "16", "32",
            "--train-steps",  "3", "--train-rounds", "1",  "--budget-shares", "0.5"};
  }
  if (name == "train") return {"--steps", "10", "--rounds", "1", "--ckpt-every", "5"};
  if (name == "memory_tier") return {"--size-mib", "8", "--rounds", "1"};
  if (name == "capacity") return {"--capacity", "16MiB", "--max-layers", "4", "--steps", "1", "--width", "64"};
  return {};
}

// One benchmark: the key of its figures, and the command line that runs it
// (`stowage-bench <name> --json ...`).
struct BenchmarkRun {
  std::string key;
  std::vector<std::string> argv;
};

// Each benchmark's run, with its Python peer's flag (train runs only to compare with its
// peer) and --quick's sizes. capacity, and the train model's activations on the simulated
// device (for device memory), run where the build has it.
std::vector<BenchmarkRun> benchmark_runs(const RunAllOptions& options) {
  const std::vector<std::string> train_model{"activation", "--train-model"};
  std::vector<BenchmarkRun> runs{{"dcp", {"dcp"}},
                                 {"activation", {"activation"}},
                                 {"activation_train", train_model},
                                 {"swap", {"swap"}},
                                 {"memory_tier", {"memory-tier"}}};
  if (build_info().with_sim) {
    runs.push_back({"activation_train_sim", train_model});
    runs.back().argv.insert(runs.back().argv.end(), {"--train-device", "sim"});
    runs.push_back({"capacity", {"capacity"}});
  }
  if (options.peer) runs.push_back({"train", {"train"}});
  for (BenchmarkRun& run : runs) {
    const bool has_peer = run.key == "dcp" || run.key == "activation" || run.key == "train";
    run.argv.insert(run.argv.begin(), executable_path());
    run.argv.emplace_back("--json");
    if (options.peer && has_peer) run.argv.emplace_back("--peer");
    if (options.quick) {
      const std::string sizes = run.key == "activation_train_sim" ? "activation_train" : run.key;
      for (std::string& arg : quick_args(sizes)) run.argv.push_back(std::move(arg));
    }
  }
  return runs;
}

// Runs `argv` (a `stowage bench <name> --json`) as a child process: each benchmark in a
// process of its own, exactly as when run by name, so that a peer is started by the
// subcommand that owns it. Returns the JSON object it printed; its stderr is ours.
json run_benchmark(const std::vector<std::string>& argv) {
  std::string command;
  for (const std::string& arg : argv) {
    std::string quoted = "'";
    for (const char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    command += quoted + "' ";
  }
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error(fmt::format("bench: cannot start '{}'", command));
  std::string output;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = pclose(pipe);
  const size_t start = output.find('{');
  json result = start == std::string::npos ? json() : json::parse(output.substr(start), nullptr, false);
  if (status != 0 || !result.is_object()) {
    throw Error(fmt::format("bench: '{}' failed (status {}); it printed: {}", command, status, output.substr(0, 400)));
  }
  return result;
}

json memory_timeline(bool quick) {
  bench::MemoryTimelineOptions options;
  if (quick) {
    options.blocks = 4;
    options.width = 64;
    options.batch = 256;
    options.segments = 2;
    options.swap_times = 2;
  }
  return bench::to_json(bench::run_memory_timeline(options));
}

// The report of a run saved earlier: `stowage bench --json`'s output, or a report.json.
void report_from_file(const RunAllOptions& options) {
  if (options.report_dir.empty()) throw InvalidArgument("bench: --from needs --report DIR");
  std::ifstream in(options.from);
  json results = in ? json::parse(in, nullptr, false) : json();
  if (results.is_object() && results.contains("results")) results = results["results"];
  if (!results.is_object()) {
    throw InvalidArgument(fmt::format("bench: --from '{}' is no readable JSON object", options.from));
  }
  bench::write_report(options.report_dir, results);
  fmt::print(stderr, "report: {}/index.html\n", options.report_dir);
}

// Every benchmark with its default size (or --quick's), then one table of all targets,
// and with --report the HTML report of it all.
void run_all(const RunAllOptions& options) {
  if (options.peer && !bench::python_peer_available()) throw Error(bench::python_peer_unavailable_reason());
  if (!options.report_dir.empty()) bench::prepare_report_dir(options.report_dir);
  json results;
  bench::Table rows;
  for (const BenchmarkRun& run : benchmark_runs(options)) {
    const json& r = results[run.key] = run_benchmark(run.argv);
    if (run.key == "dcp") add_dcp_rows(rows, r);
    if (run.key == "activation") add_activation_rows(rows, r);
    if (run.key == "activation_train" || run.key == "activation_train_sim") add_activation_train_rows(rows, r);
    if (run.key == "swap") add_swap_rows(rows, r);
    if (run.key == "train") add_train_rows(rows, r);
    if (run.key == "capacity") add_capacity_rows(rows, r);
    if (run.key == "memory_tier") add_memory_tier_rows(rows, r);
  }
  results["targets"] = rows.json();
  if (!options.report_dir.empty()) {
    results["memory_timeline"] = memory_timeline(options.quick);
    bench::write_report(options.report_dir, results);
  }
  bench::print_result(results, rows.text(), options.json);
  if (!options.report_dir.empty()) fmt::print(stderr, "report: {}/index.html\n", options.report_dir);
}

}  // namespace

void add_run_all(CLI::App& bench) {
  auto options = std::make_shared<RunAllOptions>();
  bench.add_flag("--json", options->json, "with no benchmark named: print every figure as JSON");
  bench.add_flag("--peer", options->peer,
                 "with no benchmark named: also measure PyTorch's own tools (Python peers; needs the torch wheel)");
  bench.add_flag("--quick", options->quick, "with no benchmark named: small sizes, to try the table or the report");
  bench
      .add_option("--report", options->report_dir,
                  "with no benchmark named: also write DIR/index.html (charts of every figure beside its peer and "
                  "limit, memory over a training step) and DIR/report.json")
      ->option_text("DIR");
  bench
      .add_option("--from", options->from,
                  "with --report: instead of running, draw the report of a saved run (the JSON `stowage bench "
                  "--json` printed, or a report.json)")
      ->option_text("FILE");
  bench.callback([&bench, options] {
    if (!bench.get_subcommands().empty()) return;
    if (options->from.empty()) {
      run_all(*options);
    } else {
      report_from_file(*options);
    }
  });
}

}  // namespace stowage::cli
