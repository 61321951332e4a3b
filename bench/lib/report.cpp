#include "report.h"

#include "bench_paths.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace stowage::bench {
namespace {

using nlohmann::json;

constexpr double kMiB = 1024.0 * 1024.0;
constexpr const char* kPeerPrefix = "pytorch_";

// ---- Charts from the run's JSON -------------------------------------------------------

// Keys a chart has drawn, "<benchmark>/<key>", so that the peer figures no chart knows
// get charts of their own.
using UsedKeys = std::set<std::string>;

// One bar of a group: `key` of `source`, drawn when it is a positive number (a figure
// that was not measured, or is zero, draws nothing).
struct BarSpec {
  std::string label;
  std::string key;
  std::string role;  // "stowage", "pytorch" (the Python peer) or "libtorch"
};

bool has_figure(const json& source, const std::string& key) {
  return source.is_object() && source.contains(key) && source[key].is_number() && source[key].get<double>() > 0;
}

// A group of the bars of `bars` that `source` has, their values divided by `scale`; the
// keys drawn go into `used`. set_limit adds its limit line.
json bar_group(const std::string& label, const json& source, const std::vector<BarSpec>& bars, double scale,
               const std::string& benchmark, UsedKeys& used) {
  json group = {{"label", label}, {"bars", json::array()}};
  for (const BarSpec& bar : bars) {
    if (!has_figure(source, bar.key)) continue;
    used.insert(benchmark + "/" + bar.key);
    group["bars"].push_back(
        {{"label", bar.label}, {"key", bar.key}, {"role", bar.role}, {"value", source[bar.key].get<double>() / scale}});
  }
  return group;
}

void set_limit(json& group, const std::string& label, double value) {
  if (value > 0 && std::isfinite(value)) group["limit"] = {{"label", label}, {"value", value}};
}

// The largest bar or limit of a bars chart.
double bars_max(const json& chart) {
  double max_value = 0;
  for (const json& group : chart["groups"]) {
    for (const json& bar : group["bars"]) max_value = std::max(max_value, bar["value"].get<double>());
    if (group.contains("limit")) max_value = std::max(max_value, group["limit"]["value"].get<double>());
  }
  return max_value;
}

// Times under a second read better in ms than as "0.000499 s".
void seconds_to_milliseconds_if_short(json& chart) {
  if (bars_max(chart) >= 1) return;
  for (json& group : chart["groups"]) {
    for (json& bar : group["bars"]) bar["value"] = bar["value"].get<double>() * 1e3;
    if (group.contains("limit")) group["limit"]["value"] = group["limit"]["value"].get<double>() * 1e3;
  }
  chart["unit"] = "ms";
}

// A bars chart of the groups that have a bar; null when none has.
json bar_chart(const std::string& id, const std::string& title, const std::string& unit, const std::string& note,
               const std::vector<json>& groups) {
  json kept = json::array();
  for (const json& group : groups) {
    if (!group["bars"].empty()) kept.push_back(group);
  }
  if (kept.empty()) return nullptr;
  json chart = {{"id", id}, {"title", title}, {"kind", "bars"}, {"unit", unit}, {"note", note}, {"groups", kept}};
  if (unit == "s") seconds_to_milliseconds_if_short(chart);
  return chart;
}

double json_number(const json& source, const std::string& key) {
  return source.is_object() && source.contains(key) && source[key].is_number() ? source[key].get<double>() : 0.0;
}

// The peer bars of `source`'s keys that start with "pytorch_" + `prefix` and end with
// `suffix` (e.g. a run's "pytorch_step_s" and "pytorch_non_reentrant_step_s").
std::vector<BarSpec> peer_bars(const json& source, const std::string& prefix, const std::string& suffix) {
  std::vector<BarSpec> bars;
  const std::string start = kPeerPrefix + prefix;
  for (const auto& item : source.items()) {
    const std::string& key = item.key();
    if (key.size() >= start.size() + suffix.size() && key.compare(0, start.size(), start) == 0 &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
      // "pytorch_non_reentrant_step_s": "PyTorch non reentrant".
      std::string label = key.substr(start.size(), key.size() - start.size() - suffix.size());
      std::replace(label.begin(), label.end(), '_', ' ');
      while (!label.empty() && label.back() == ' ') label.pop_back();
      while (!label.empty() && label.front() == ' ') label.erase(0, 1);
      bars.push_back({label.empty() ? "PyTorch" : "PyTorch " + label, key, "pytorch"});
    }
  }
  return bars;
}

void dcp_charts(const json& dcp, UsedKeys& used, json& charts) {
  const double write = json_number(dcp, "raw_write_gbps");
  const double memcpy_gbps = json_number(dcp, "memcpy_gbps");
  json two = bar_group("2 writer threads", dcp,
                       {{"stowage", "save_gbps", "stowage"},
                        {"PyTorch DCP", "pytorch_dcp_save_two_threads_gbps", "pytorch"},
                        {"torch::save", "torch_save_gbps", "libtorch"}},
                       1, "dcp", used);
  json one =
      bar_group("1 writer thread", dcp,
                {{"stowage", "save_one_thread_gbps", "stowage"}, {"PyTorch DCP", "pytorch_dcp_save_gbps", "pytorch"}},
                1, "dcp", used);
  set_limit(two, "raw sequential write + fsync", write);
  set_limit(one, "raw sequential write + fsync", write);
  charts.push_back(bar_chart("dcp-save", "Checkpoint save (fsync'd)", "GB/s",
                             "higher is better; dashed: the disk's raw sequential write", {two, one}));

  json load = bar_group("load", dcp,
                        {{"stowage", "load_gbps", "stowage"},
                         {"PyTorch DCP", "pytorch_dcp_load_gbps", "pytorch"},
                         {"torch::load", "torch_load_gbps", "libtorch"}},
                        1, "dcp", used);
  set_limit(load, "memcpy", memcpy_gbps);
  json stage = bar_group("stage", dcp,
                         {{"cached", "stage_cached_gbps", "stowage"}, {"uncached", "stage_uncached_gbps", "stowage"}},
                         1, "dcp", used);
  set_limit(stage, "memcpy", memcpy_gbps);
  charts.push_back(bar_chart("dcp-load-stage", "Checkpoint load and staging", "GB/s",
                             "higher is better; dashed: memcpy into existing buffers", {load, stage}));

  json cached = bar_group("writer's cached staging", dcp, {{"stowage", "async_block_s", "stowage"}}, 1, "dcp", used);
  set_limit(cached, "target: 1.1 x a blocking stage", 1.1 * json_number(dcp, "stage_s"));
  used.insert("dcp/stage_s");
  json stager = bar_group(
      "DefaultStager", dcp,
      {{"stowage", "async_block_default_stager_s", "stowage"}, {"PyTorch DCP", "pytorch_dcp_async_block_s", "pytorch"}},
      1, "dcp", used);
  json complete = bar_group("until committed (DefaultStager)", dcp,
                            {{"stowage", "async_complete_default_stager_s", "stowage"},
                             {"PyTorch DCP", "pytorch_dcp_async_complete_s", "pytorch"}},
                            1, "dcp", used);
  charts.push_back(bar_chart("dcp-async", "Caller blocked by async_save, and the save's whole time", "s",
                             "lower is better; dashed: the target, 1.1 x a blocking stage of the same state",
                             {cached, stager, complete}));
  json peak = bar_group(
      "a save", dcp,
      {{"stowage", "save_peak_host_bytes", "stowage"}, {"PyTorch DCP", "pytorch_dcp_peak_host_bytes", "pytorch"}}, kMiB,
      "dcp", used);
  charts.push_back(bar_chart("dcp-peak-host", "Peak host memory of a save", "MiB",
                             "lower is better; the RSS high-water mark above the RSS at the start", {peak}));
}

void activation_charts(const json& activation, UsedKeys& used, json& charts) {
  const double plain_step = json_number(activation, "plain_step_s");
  const double base = json_number(activation, "params_and_grads");
  const double memory_limit = (base + (json_number(activation, "plain_peak_bytes") - base) / 3) / kMiB;
  std::vector<BarSpec> step_bars{{"stowage", "plain_step_s", "stowage"}};
  for (const BarSpec& bar : peer_bars(activation, "plain", "step_s")) step_bars.push_back(bar);
  std::vector<json> steps{bar_group("plain", activation, step_bars, 1, "activation", used)};
  std::vector<json> peaks{
      bar_group("plain", activation, {{"stowage", "plain_peak_bytes", "stowage"}}, kMiB, "activation", used)};
  // Against PyTorch, peaks measured alike on both sides (the benchmark's peak_measure):
  // stowage's compared_peak_bytes beside PyTorch's, in a chart of their own.
  std::vector<BarSpec> compared_bars{{"stowage", "plain_compared_peak_bytes", "stowage"}};
  for (const BarSpec& bar : peer_bars(activation, "plain", "peak_bytes")) compared_bars.push_back(bar);
  std::vector<json> compared{bar_group("plain", activation, compared_bars, kMiB, "activation", used)};
  for (const json& run : activation.value("runs", json::array())) {
    const std::string label = fmt::format("{} segments", run.value("segments", 0));
    step_bars = {{"stowage", "step_s", "stowage"}};
    for (const BarSpec& bar : peer_bars(run, "", "step_s")) step_bars.push_back(bar);
    steps.push_back(bar_group(label, run, step_bars, 1, "activation", used));
    set_limit(steps.back(), "target: 1.4 x plain step", 1.4 * plain_step);
    peaks.push_back(bar_group(label, run, {{"stowage", "peak_bytes", "stowage"}}, kMiB, "activation", used));
    if (run.value("segments", 0) == activation.value("sqrt_segments", -1)) {
      set_limit(peaks.back(), "target: a third of plain's activations", memory_limit);
    }
    compared_bars = {{"stowage", "compared_peak_bytes", "stowage"}};
    for (const BarSpec& bar : peer_bars(run, "", "peak_bytes")) compared_bars.push_back(bar);
    compared.push_back(bar_group(label, run, compared_bars, kMiB, "activation", used));
  }
  charts.push_back(bar_chart("activation-step", "Activation checkpointing: forward + backward step", "s",
                             "lower is better; dashed: the target, 1.4 x stowage's plain step", steps));
  charts.push_back(bar_chart("activation-peak", "Activation checkpointing: peak memory of a step", "MiB",
                             "lower is better; parameters and gradients included; dashed: the target (activations a "
                             "third of plain's) at sqrt(blocks) segments",
                             peaks));
  if (activation.contains("plain_compared_peak_bytes")) {
    charts.push_back(bar_chart("activation-peak-vs-pytorch", "Activation checkpointing: peak memory beside PyTorch's",
                               "MiB",
                               fmt::format("lower is better; both sides measured alike: {}",
                                           activation.value("peak_measure", std::string("?"))),
                               compared));
  }
}

// `stowage bench activation --train-model` (the figures under `key`), a chart pair per
// sequence length: each mode's activation peak against what it is asked to stay under (a
// budget, or the goal of its kind), and, on a device whose time is measured ("timed"), its
// step against selective recompute's goal.
void activation_train_charts(const std::string& key, const json& r, UsedKeys& used, json& charts) {
  const std::string device = r.value("device", std::string("?"));
  const bool timed = r.value("timed", false);
  std::map<int64_t, std::pair<std::vector<json>, std::vector<json>>> by_seq_len;  // peaks, steps
  for (const json& row : r.value("rows", json::array())) {
    auto& [peaks, steps] = by_seq_len[row.value("seq_len", int64_t(0))];
    const std::string mode = row.value("mode", std::string("?"));
    peaks.push_back(bar_group(mode, row, {{"stowage", "peak_activation_bytes", "stowage"}}, kMiB, key, used));
    set_limit(peaks.back(), row.value("budget_bytes", int64_t(0)) > 0 ? "its budget" : "the goal",
              json_number(row, "peak_target_bytes") / kMiB);
    if (!timed) continue;
    steps.push_back(bar_group(mode, row, {{"stowage", "step_s", "stowage"}}, 1, key, used));
    set_limit(steps.back(), "the goal", json_number(row, "step_target_s"));
  }
  for (const auto& [seq_len, charts_at] : by_seq_len) {
    const std::string id = fmt::format("{}-seq{}", device, seq_len);
    const std::string what = fmt::format("stowage train's transformer at sequence length {} ({})", seq_len, device);
    charts.push_back(bar_chart("activation-train-peak-" + id, what + ": activation peak of a step", "MiB",
                               "lower is better; dashed: a budget, or the goal (selective recompute: half of none's; "
                               "offload: a third of the same segments' without it)",
                               charts_at.first));
    charts.push_back(bar_chart("activation-train-step-" + id, what + ": step time", "s",
                               "lower is better; dashed: selective recompute's goal, a third of whole blocks' "
                               "overhead at sqrt(n) segments",
                               charts_at.second));
  }
}

void swap_charts(const json& swap, UsedKeys& used, json& charts) {
  const double plain_step = json_number(swap, "plain_step_s");
  const double plain_state = json_number(swap, "plain_state_bytes");
  std::vector<json> steps{bar_group("plain AdamW", swap, {{"AdamW", "plain_step_s", "libtorch"}}, 1, "swap", used)};
  std::vector<json> peaks{
      bar_group("plain AdamW", swap, {{"AdamW", "plain_state_bytes", "libtorch"}}, kMiB, "swap", used)};
  for (const json& run : swap.value("runs", json::array())) {
    const int64_t times = run.value("swap_times", int64_t(1));
    const std::string label = fmt::format("swap_times {}", times);
    steps.push_back(bar_group(label, run, {{"stowage", "step_s", "stowage"}}, 1, "swap", used));
    set_limit(steps.back(), "target: 1.5 x plain step", 1.5 * plain_step);
    peaks.push_back(
        bar_group(label, run, {{"stowage", "peak_resident_during_step_bytes", "stowage"}}, kMiB, "swap", used));
    set_limit(peaks.back(), "target: (2 / swap_times + 0.05) x plain state",
              (2.0 / static_cast<double>(times) + 0.05) * plain_state / kMiB);
  }
  charts.push_back(bar_chart("swap-step", "Optimizer-state swap: optimizer step", "s",
                             "lower is better; dashed: the target, 1.5 x the plain AdamW step", steps));
  charts.push_back(bar_chart("swap-peak", "Optimizer-state swap: optimizer memory on the device during a step", "MiB",
                             "lower is better; dashed: the target, (2 / swap_times + 0.05) x plain AdamW's state",
                             peaks));
}

// The simulated device's capacity benchmark: the largest model each way trains, per capacity.
void capacity_charts(const json& capacity, UsedKeys& used, json& charts) {
  std::vector<json> groups;
  for (const json& row : capacity.value("capacities", json::array())) {
    groups.push_back(bar_group(row.value("capacity", std::string("?")), row,
                               {{"plain AdamW", "plain_parameters", "libtorch"},
                                {"stowage, swap to host", "stowage_host_parameters", "stowage"},
                                {"stowage, swap to disk", "stowage_disk_parameters", "stowage"}},
                               1e6, "capacity", used));
    set_limit(groups.back(), "target: 3 x plain's parameters", 3 * json_number(row, "plain_parameters") / 1e6);
  }
  charts.push_back(bar_chart("capacity", "The largest model that trains on a device of fixed capacity (simulated)",
                             "M parameters", "higher is better; dashed: the target, 3 x what plain training fits",
                             groups));
}

// The memory tier (issue 40): its save's throughput and its recoveries against storage's,
// each judged by the 5x target.
void memory_tier_charts(const json& tier, UsedKeys& used, json& charts) {
  json save = bar_group("save", tier,
                        {{"memory tier, own copy", "memory_save_gbps", "stowage"},
                         {"memory tier + replica", "memory_replicated_gbps", "stowage"},
                         {"storage (fsync'd)", "storage_save_gbps", "stowage"}},
                        1, "memory_tier", used);
  set_limit(save, "target: 5 x storage", 5 * json_number(tier, "storage_save_gbps"));
  charts.push_back(bar_chart("memory-tier-save", "Memory tier: save throughput, all ranks", "GB/s",
                             "higher is better; dashed: the target, 5 x the storage save's", {save}));
  json restore = bar_group("restore", tier,
                           {{"own memory", "restore_memory_s", "stowage"},
                            {"peer replica", "restore_replica_s", "stowage"},
                            {"storage, cold", "restore_storage_cold_s", "stowage"}},
                           1, "memory_tier", used);
  set_limit(restore, "target: storage cold / 5", json_number(tier, "restore_storage_cold_s") / 5);
  charts.push_back(bar_chart("memory-tier-restore", "Memory tier: recovery time", "s",
                             "lower is better; dashed: the target, a fifth of the cold storage restore", {restore}));
}

// The unit and scale of a key by its suffix.
std::pair<std::string, double> unit_of(const std::string& key) {
  const auto ends = [&](const std::string& suffix) {
    return key.size() >= suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("_gbps")) return {"GB/s", 1};
  if (ends("_bytes")) return {"MiB", kMiB};
  if (ends("_per_s")) return {"per second", 1};
  if (ends("_s")) return {"s", 1};
  return {"", 1};
}

// The stowage figure a peer's key is measured against: "stowage_<rest>", "<rest>", or
// "<rest>" less its first word ("pytorch_dcp_load_gbps": "load_gbps"); empty if none.
std::string counterpart_of(const json& source, const std::string& peer_key) {
  const std::string rest = peer_key.substr(std::string(kPeerPrefix).size());
  const size_t word = rest.find('_');
  for (const std::string& key :
       {"stowage_" + rest, rest, word == std::string::npos ? std::string() : rest.substr(word + 1)}) {
    if (!key.empty() && has_figure(source, key)) return key;
  }
  return "";
}

// A chart for every peer figure no chart above has drawn, beside its counterpart.
void peer_charts(const std::string& benchmark, const json& source, UsedKeys& used, json& charts) {
  for (const auto& item : source.items()) {
    const std::string& key = item.key();
    if (key.rfind(kPeerPrefix, 0) != 0 || !has_figure(source, key) || used.count(benchmark + "/" + key) > 0) continue;
    const std::string stowage_key = counterpart_of(source, key);
    const auto [unit, scale] = unit_of(key);
    charts.push_back(
        bar_chart(benchmark + "-" + key, fmt::format("{}: {}", benchmark, key), unit,
                  stowage_key.empty() ? "PyTorch's figure; stowage has no counterpart in this run"
                                      : fmt::format("{} beside {}", stowage_key, key),
                  {bar_group(benchmark, source, {{"stowage", stowage_key, "stowage"}, {"PyTorch", key, "pytorch"}},
                             scale, benchmark, used)}));
  }
}

// The limit of a target text ("<= 0.333", ">= 2"): its relation and number.
std::pair<std::string, double> parse_target(const std::string& target) {
  const size_t space = target.find(' ');
  if (space == std::string::npos) return {"", 0};
  return {target.substr(0, space), std::atof(target.c_str() + space + 1)};
}

json targets_chart(const json& targets) {
  json rows = json::array();
  for (const json& row : targets) {
    const auto [relation, limit] = parse_target(row.value("target", ""));
    const double value = row.value("value", 0.0);
    if (!(value > 0) || !std::isfinite(value) || !(limit > 0)) continue;
    rows.push_back({{"label", fmt::format("{}: {}", row.value("benchmark", ""), row.value("figure", ""))},
                    {"value", value},
                    {"relative", value / limit},
                    {"relation", relation},
                    {"limit", limit},
                    {"met", row.value("met", false)}});
  }
  if (rows.empty()) return nullptr;
  return {{"id", "targets"},
          {"title", "Every target: the measured ratio and its limit"},
          {"kind", "targets"},
          {"unit", "ratio"},
          {"note",
           "each ratio over its target's limit (>= or <=, as named beside it): green met, red not met; "
           "bars past 3x are cut there"},
          {"rows", rows}};
}

json timeline_chart(const json& timeline) {
  json series = json::array();
  for (const json& run : timeline.value("runs", json::array())) {
    const json& t = run["t_s"];
    const json& bytes = run["bytes"];
    json points = json::array();
    for (size_t i = 0; i < t.size() && i < bytes.size(); ++i) {
      points.push_back({t[i].get<double>() * 1e3, bytes[i].get<double>() / kMiB});
    }
    if (points.size() < 2) continue;
    series.push_back({{"label", fmt::format("{}: peak {:.1f} MiB, step {:.1f} ms", run.value("name", ""),
                                            run.value("peak_bytes", 0.0) / kMiB, run.value("step_s", 0.0) * 1e3)},
                      {"points", points}});
  }
  if (series.empty()) return nullptr;
  return {
      {"id", "memory-timeline"},
      {"title", "Memory over one training step (forward, backward, AdamW step)"},
      {"kind", "lines"},
      {"unit", "MiB"},
      {"x_unit", "ms"},
      {"note", fmt::format("bytes allocated (the accounting's peak over each {:.1f} ms sample) of an MLP of {} "
                           "blocks, Linear {}x{} + GELU, batch {}; checkpointed: {} segments; swapped: swap_times {}",
                           timeline.value("interval_s", 0.0) * 1e3, timeline.value("blocks", 0),
                           timeline.value("width", 0), timeline.value("width", 0), timeline.value("batch", 0),
                           timeline.value("segments", 0), timeline.value("swap_times", 0))},
      {"series", series}};
}

// ---- The page: drawn by bench/report/plot_report.py ------------------------------------

// Debian's python3, whose matplotlib (python3-matplotlib) draws the page; not the torch
// wheel's environment, which has none.
constexpr const char* kSystemPython = "/usr/bin/python3";

// How many marks (bars, limit lines, curves) the page must draw of `chart`.
int marks_of(const json& chart) {
  const std::string kind = chart["kind"];
  if (kind == "targets") return static_cast<int>(chart["rows"].size()) + 1;  // and the line at 1x
  if (kind == "lines") return static_cast<int>(chart["series"].size());
  int marks = 0;
  for (const json& group : chart["groups"]) {
    marks += static_cast<int>(group["bars"].size()) + (group.contains("limit") ? 1 : 0);
  }
  return marks;
}

std::string shell_quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the page's script with `argument` (a report directory, or --check); throws Error
// naming what is missing, or with the script's output when it fails.
void run_plotter(const std::string& argument) {
  if (::access(kSystemPython, X_OK) != 0) {
    throw Error(
        fmt::format("bench report: {} is missing; the report's charts need Debian's python3 and "
                    "python3-matplotlib (scripts/setup.sh installs them)",
                    kSystemPython));
  }
  const std::string command =
      fmt::format("{} {} {} 2>&1", kSystemPython, shell_quoted(paths::report_script()), shell_quoted(argument));
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error(fmt::format("bench report: cannot run {}: {}", kSystemPython, std::strerror(errno)));
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (status != 0)
    throw Error(output.empty() ? fmt::format("bench report: {} failed", paths::report_script()) : output);
}

void write_report_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw InvalidArgument(fmt::format("bench report: cannot write '{}'", path.string()));
}

void create_report_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw InvalidArgument(fmt::format("bench report: cannot create the directory '{}': {}", dir,
                                      error ? error.message() : "a file of that name is in the way"));
  }
}

}  // namespace

json report_charts(const json& results) {
  UsedKeys used;
  json charts = json::array();
  charts.push_back(targets_chart(results.value("targets", json::array())));
  if (results.contains("dcp")) dcp_charts(results["dcp"], used, charts);
  if (results.contains("activation")) activation_charts(results["activation"], used, charts);
  for (const char* key : {"activation_train", "activation_train_sim"}) {
    if (results.contains(key)) activation_train_charts(key, results[key], used, charts);
  }
  if (results.contains("swap")) swap_charts(results["swap"], used, charts);
  if (results.contains("capacity")) capacity_charts(results["capacity"], used, charts);
  if (results.contains("memory_tier")) memory_tier_charts(results["memory_tier"], used, charts);
  for (const auto& item : results.items()) {
    if (item.value().is_object() && item.key() != "memory_timeline")
      peer_charts(item.key(), item.value(), used, charts);
  }
  if (results.contains("memory_timeline")) charts.push_back(timeline_chart(results["memory_timeline"]));
  json kept = json::array();
  for (json& chart : charts) {
    if (chart.is_null()) continue;
    chart["marks"] = marks_of(chart);
    kept.push_back(std::move(chart));
  }
  return kept;
}

void prepare_report_dir(const std::string& dir) {
  create_report_dir(dir);
  run_plotter("--check");
}

void write_report(const std::string& dir, const json& results) {
  create_report_dir(dir);
  write_report_file(std::filesystem::path(dir) / "report.json",
                    json{{"results", results}, {"charts", report_charts(results)}}.dump(1) + "\n");
  run_plotter(dir);  // reads report.json, writes index.html
}

}  // namespace stowage::bench
