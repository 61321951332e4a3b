#include "report.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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

// ---- SVG ------------------------------------------------------------------------------

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The colour of a bar's role, or of a curve by its position.
std::string role_colour(const std::string& role) {
  if (role == "stowage") return "#1f77b4";
  if (role == "pytorch") return "#ff7f0e";
  if (role == "libtorch") return "#8c8c8c";
  return "#d62728";
}
const char* const kCurveColours[] = {"#8c8c8c", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"};

// A step of 1, 2 or 5 x 10^k giving about five ticks up to `top`.
double tick_step(double top) {
  const double rough = top / 5;
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= rough) return m * power;
  }
  return 10 * power;
}

// The frame of a chart: plot area inside the SVG, in pixels.
struct ChartFrame {
  double left = 64, top = 40, width = 560, height = 220;
  double bottom() const { return top + height; }
};

// Y gridlines, tick labels and the axis title; returns the axis's top value.
double y_axis(std::string& svg, const ChartFrame& f, double max_value, const std::string& unit) {
  const double step = tick_step(max_value > 0 ? max_value * 1.1 : 1);
  const double top = std::max(step, std::ceil(max_value * 1.1 / step) * step);
  const int ticks = static_cast<int>(std::lround(top / step));
  for (int i = 0; i <= ticks; ++i) {
    const double v = step * i;
    const double y = f.bottom() - v / top * f.height;
    svg += fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#e0e0e0"/>)", f.left, f.left + f.width,
                       y, y);
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" font-size="11">{:g}</text>)", f.left - 6, y + 4, v);
  }
  svg += fmt::format(
      R"svg(<text transform="translate(14,{:.1f}) rotate(-90)" text-anchor="middle" font-size="12">{}</text>)svg",
      f.top + f.height / 2, xml_escape(unit));
  svg += fmt::format(R"(<line x1="{0}" x2="{0}" y1="{1}" y2="{2}" stroke="#333"/>)", f.left, f.top, f.bottom());
  svg +=
      fmt::format(R"(<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="#333"/>)", f.left, f.left + f.width, f.bottom());
  return top;
}

// The legend along the top, from `x`: (colour, label, dashed line instead of a box);
// `stacked`: one item a row.
std::string svg_legend(const std::vector<std::tuple<std::string, std::string, bool>>& items, double x,
                       bool stacked = false) {
  std::string svg;
  double y = 14;
  for (const auto& [fill, label, dashed] : items) {
    svg += dashed ? fmt::format(R"(<line x1="{0}" x2="{1}" y1="{2}" y2="{2}" stroke="{3}" stroke-width="2" )"
                                R"(stroke-dasharray="5,3"/>)",
                                x, x + 16, y, fill)
                  : fmt::format(R"(<rect x="{}" y="{}" width="12" height="12" fill="{}"/>)", x, y - 6, fill);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="11">{}</text>)", x + 20, y + 4, xml_escape(label));
    if (stacked) {
      y += 16;
    } else {
      x += 28 + 6.2 * static_cast<double>(label.size());
    }
  }
  return svg;
}

std::string svg_open(const json& chart, double width, double height) {
  return fmt::format(R"(<svg id="{}" class="chart" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" )"
                     R"(viewBox="0 0 {} {}" font-family="sans-serif">)",
                     chart["id"].get<std::string>(), width, height, width, height);
}

// The legend entries of a bars chart: the roles present, then each limit's label.
std::vector<std::tuple<std::string, std::string, bool>> bars_legend(const json& chart) {
  const std::vector<std::pair<std::string, std::string>> roles{
      {"stowage", "stowage"}, {"pytorch", "PyTorch (Python)"}, {"libtorch", "LibTorch / unwrapped"}};
  std::vector<std::tuple<std::string, std::string, bool>> items;
  for (const auto& [role, name] : roles) {
    bool present = false;
    for (const json& group : chart["groups"]) {
      for (const json& bar : group["bars"]) present = present || bar["role"] == role;
    }
    if (present) items.emplace_back(role_colour(role), name, false);
  }
  std::set<std::string> limits;
  for (const json& group : chart["groups"]) {
    if (group.contains("limit")) limits.insert(group["limit"]["label"].get<std::string>());
  }
  for (const std::string& label : limits) items.emplace_back(role_colour("limit"), label, true);
  return items;
}

// A bar's label under it, a word a line, so that the labels of bars side by side stay
// apart ("PyTorch DCP" beside "torch::save").
std::string label_under(double x, double y, const std::string& label) {
  std::string svg = fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="9" fill="#555">)", x, y);
  std::istringstream words(label);
  bool first = true;
  for (std::string word; words >> word; first = false) {
    svg += fmt::format(R"(<tspan x="{:.1f}" dy="{}">{}</tspan>)", x, first ? 0 : 10, xml_escape(word));
  }
  return svg + "</text>";
}

// Draws a bars chart; returns the SVG and sets chart["marks"].
std::string bars_svg(json& chart) {
  ChartFrame f;
  const double max_value = bars_max(chart);
  std::string svg = svg_open(chart, f.left + f.width + 16, f.bottom() + 56);
  svg += svg_legend(bars_legend(chart), f.left);
  const double top = y_axis(svg, f, max_value, chart["unit"].get<std::string>());
  const double slot = f.width / static_cast<double>(chart["groups"].size());
  int marks = 0;
  for (size_t g = 0; g < chart["groups"].size(); ++g) {
    const json& group = chart["groups"][g];
    const double bar_width = std::min(60.0, (slot - 24) / static_cast<double>(group["bars"].size()));
    double x =
        f.left + slot * static_cast<double>(g) + (slot - bar_width * static_cast<double>(group["bars"].size())) / 2;
    const double group_left = x;
    for (const json& bar : group["bars"]) {
      const double value = bar["value"].get<double>();
      const double h = std::max(0.5, value / top * f.height);
      svg += fmt::format(R"(<rect class="mark" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}">)"
                         R"(<title>{}: {:.4g} {}</title></rect>)",
                         x + 2, f.bottom() - h, bar_width - 4, h, role_colour(bar["role"]), xml_escape(bar["label"]),
                         value, xml_escape(chart["unit"]));
      svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="10">{:.3g}</text>)",
                         x + bar_width / 2, f.bottom() - h - 3, value);
      svg += label_under(x + bar_width / 2, f.bottom() + 13, bar["label"]);
      x += bar_width;
      ++marks;
    }
    if (group.contains("limit")) {
      const double y = f.bottom() - group["limit"]["value"].get<double>() / top * f.height;
      svg += fmt::format(R"(<line class="mark" x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}" stroke="{}" )"
                         R"(stroke-width="2" stroke-dasharray="6,3"><title>{}: {:.4g} {}</title></line>)",
                         group_left - 8, x + 8, y, y, role_colour("limit"), xml_escape(group["limit"]["label"]),
                         group["limit"]["value"].get<double>(), xml_escape(chart["unit"]));
      ++marks;
    }
    svg +=
        fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="12" font-weight="bold">{}</text>)",
                    f.left + slot * (static_cast<double>(g) + 0.5), f.bottom() + 40, xml_escape(group["label"]));
  }
  chart["marks"] = marks;
  return svg + "</svg>";
}

// Draws the targets chart: one row per target, its ratio as a bar measured against its
// own limit (so that every limit lines up at 1x), cut at kTargetsAxis x with the number
// beside it; returns the SVG and sets chart["marks"].
constexpr double kTargetsAxis = 3;
std::string targets_svg(json& chart) {
  const json& rows = chart["rows"];
  size_t longest = 0;
  for (const json& row : rows) longest = std::max(longest, row["label"].get<std::string>().size());
  const double label_width = 16 + 6.2 * static_cast<double>(longest), plot_width = 330, row_height = 22;
  const double bottom = 32 + row_height * static_cast<double>(rows.size());
  std::string svg = svg_open(chart, label_width + plot_width + 110, bottom + 36);
  svg += svg_legend({{"#2ca02c", "met", false}, {"#d62728", "not met", false}, {"#333", "the target's limit", true}},
                    label_width);
  const auto x_of = [&](double relative) {
    return label_width + std::min(relative, kTargetsAxis) / kTargetsAxis * plot_width;
  };
  for (int tick = 0; tick <= static_cast<int>(kTargetsAxis); ++tick) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="11">{}x</text>)", x_of(tick),
                       bottom + 14, tick);
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="12">measured / the target's )"
                     R"(limit</text>)",
                     x_of(kTargetsAxis / 2), bottom + 30);
  int marks = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    const double y = 32 + row_height * static_cast<double>(i);
    const double relative = row["relative"].get<double>();
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" font-size="11">{}</text>)", label_width - 8, y + 14,
                       xml_escape(row["label"]));
    svg += fmt::format(R"(<rect class="mark" x="{}" y="{:.1f}" width="{:.1f}" height="{}" fill="{}">)"
                       R"(<title>{:.4g} (target {} {:g})</title></rect>)",
                       label_width, y + 3, std::max(0.5, x_of(relative) - label_width), row_height - 6,
                       row["met"].get<bool>() ? "#2ca02c" : "#d62728", row["value"].get<double>(),
                       xml_escape(row["relation"]), row["limit"].get<double>());
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10">{:.3g} ({} {:g})</text>)",
                       std::max(x_of(relative), x_of(1)) + 6, y + 14, row["value"].get<double>(),
                       xml_escape(row["relation"]), row["limit"].get<double>());
    ++marks;
  }
  svg += fmt::format(R"(<line class="mark" x1="{0:.1f}" x2="{0:.1f}" y1="28" y2="{1:.1f}" stroke="#333" )"
                     R"(stroke-width="2" stroke-dasharray="4,3"/>)",
                     x_of(1), bottom);
  chart["marks"] = marks + 1;
  return svg + "</svg>";
}

// Draws a lines chart (x in chart["x_unit"], y in chart["unit"]); sets chart["marks"].
std::string lines_svg(json& chart) {
  ChartFrame f;
  f.top = 20 + 16 * static_cast<double>(chart["series"].size());
  f.height = 280;
  double max_x = 0, max_y = 0;
  for (const json& series : chart["series"]) {
    for (const json& p : series["points"]) {
      max_x = std::max(max_x, p[0].get<double>());
      max_y = std::max(max_y, p[1].get<double>());
    }
  }
  std::string svg = svg_open(chart, f.left + f.width + 16, f.bottom() + 44);
  std::vector<std::tuple<std::string, std::string, bool>> items;
  for (size_t i = 0; i < chart["series"].size(); ++i) {
    items.emplace_back(kCurveColours[i % 5], chart["series"][i]["label"].get<std::string>(), false);
  }
  svg += svg_legend(items, f.left, /*stacked=*/true);
  const double top = y_axis(svg, f, max_y, chart["unit"].get<std::string>());
  const double x_step = tick_step(max_x > 0 ? max_x : 1);
  const double right = std::max(x_step, std::ceil(max_x / x_step) * x_step);
  const int ticks = static_cast<int>(std::lround(right / x_step));
  for (int i = 0; i <= ticks; ++i) {
    const double v = x_step * i;
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="11">{:g}</text>)",
                       f.left + v / right * f.width, f.bottom() + 16, v);
  }
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="12">time since the step began, )"
                     R"({}</text>)",
                     f.left + f.width / 2, f.bottom() + 36, xml_escape(chart["x_unit"]));
  int marks = 0;
  for (size_t i = 0; i < chart["series"].size(); ++i) {
    // Steps, not slopes: a sample is the most bytes allocated since the previous one, so
    // its value holds over the whole interval before it.
    std::string points;
    const json& samples = chart["series"][i]["points"];
    const auto x = [&](size_t k) { return f.left + samples[k][0].get<double>() / right * f.width; };
    const auto y = [&](size_t k) { return f.bottom() - samples[k][1].get<double>() / top * f.height; };
    points += fmt::format("{:.1f},{:.1f} ", x(0), y(0));
    for (size_t k = 1; k < samples.size(); ++k) {
      points += fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", x(k - 1), y(k), x(k), y(k));
    }
    svg += fmt::format(R"(<polyline class="mark" fill="none" stroke="{}" stroke-width="2" points="{}">)"
                       R"(<title>{}</title></polyline>)",
                       kCurveColours[i % 5], points, xml_escape(chart["series"][i]["label"]));
    ++marks;
  }
  chart["marks"] = marks;
  return svg + "</svg>";
}

// ---- The page -------------------------------------------------------------------------

// Run by the browser once the page is laid out: for each chart, how many of its marks
// have a nonzero size, written into #chart-check as JSON (the report test reads it).
constexpr const char* kCheckScript = R"(<script>
(function () {
  var result = {};
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var marks = svg.querySelectorAll('.mark'), drawn = 0;
    marks.forEach(function (mark) {
      var box = mark.getBBox();
      var sized = mark.tagName === 'rect' ? box.width > 0 && box.height > 0 : box.width > 0 || box.height > 0;
      if (sized) drawn++;
    });
    var box = svg.getBoundingClientRect();
    result[svg.id] = {marks: marks.length, drawn: drawn, width: box.width, height: box.height};
  });
  document.getElementById('chart-check').textContent = JSON.stringify(result);
})();
</script>)";

constexpr const char* kStyle = R"(<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
main { display: flex; flex-wrap: wrap; gap: 8px 40px; }
figure { margin: 0 0 24px 0; max-width: 720px; }
figcaption { color: #555; font-size: 13px; margin-top: 4px; }
h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
pre { font-size: 11px; color: #777; white-space: pre-wrap; }
</style>)";

std::string chart_html(json& chart) {
  const std::string kind = chart["kind"];
  const std::string svg = kind == "bars" ? bars_svg(chart) : kind == "targets" ? targets_svg(chart) : lines_svg(chart);
  return fmt::format("<figure><h3>{}</h3>{}<figcaption>{}</figcaption></figure>\n", xml_escape(chart["title"]), svg,
                     xml_escape(chart.value("note", "")));
}

std::string report_page(json& charts) {
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>stowage bench report</title>{}</head>"
      "<body>\n<h1>stowage bench report</h1>\n<p>{}: every figure of one run of <code>stowage bench</code> beside "
      "its peer, measured in the same run, and its limit or target. Every number is in report.json.</p>\n",
      kStyle, when);
  html += "<main>\n";
  for (json& chart : charts) html += chart_html(chart);
  html += "</main>\n<h2>Render check</h2><pre id=\"chart-check\">not run</pre>\n";
  return html + kCheckScript + "\n</body></html>\n";
}

void write_report_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw InvalidArgument(fmt::format("bench report: cannot write '{}'", path.string()));
}

}  // namespace

json report_charts(const json& results) {
  UsedKeys used;
  json charts = json::array();
  charts.push_back(targets_chart(results.value("targets", json::array())));
  if (results.contains("dcp")) dcp_charts(results["dcp"], used, charts);
  if (results.contains("activation")) activation_charts(results["activation"], used, charts);
  if (results.contains("swap")) swap_charts(results["swap"], used, charts);
  if (results.contains("capacity")) capacity_charts(results["capacity"], used, charts);
  for (const auto& item : results.items()) {
    if (item.value().is_object() && item.key() != "memory_timeline")
      peer_charts(item.key(), item.value(), used, charts);
  }
  if (results.contains("memory_timeline")) charts.push_back(timeline_chart(results["memory_timeline"]));
  json kept = json::array();
  for (json& chart : charts) {
    if (!chart.is_null()) kept.push_back(std::move(chart));
  }
  return kept;
}

void prepare_report_dir(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw InvalidArgument(fmt::format("bench report: cannot create the directory '{}': {}", dir,
                                      error ? error.message() : "a file of that name is in the way"));
  }
}

void write_report(const std::string& dir, const json& results) {
  prepare_report_dir(dir);
  json charts = report_charts(results);
  const std::string html = report_page(charts);  // sets each chart's "marks"
  write_report_file(std::filesystem::path(dir) / "index.html", html);
  write_report_file(std::filesystem::path(dir) / "report.json",
                    json{{"results", results}, {"charts", charts}}.dump(1) + "\n");
}

}  // namespace stowage::bench
