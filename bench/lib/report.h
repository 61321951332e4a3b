#pragma once

// The HTML report of `stowage bench --report DIR`: every figure of a run drawn beside its
// peer (PyTorch's Python tools, LibTorch's torch::save/torch::load) and its limit or
// target, as inline SVG charts in one self-contained page (no network, no external
// script or style), which bench/report/plot_report.py draws with matplotlib (Debian's
// python3-matplotlib, run by /usr/bin/python3).
//
// The charts are built from the run's JSON only (each benchmark's to_json under its
// name, as `stowage bench --json` prints it), so that figures a benchmark adds later
// still show: a peer's figure is any key that starts with "pytorch_"; one that no chart
// below knows gets a chart of its own, beside its stowage counterpart when one is found.
// A figure whose peer did not run shows its limit only.

#include <nlohmann/json.hpp>

#include <string>

namespace stowage::bench {

// The charts of `results`: an array of objects with "id", "title", "kind" ("bars",
// "targets" or "lines"), "unit", the data drawn, and "marks": how many marks (bars, limit
// lines, curves) the page must draw of it.
// `results` holds any of "dcp", "activation", "swap", "train", "memory_tier" (benchmark objects),
// "targets" (rows of {benchmark, figure, value, target, met}) and "memory_timeline"
// (memory_timeline.h's to_json).
nlohmann::json report_charts(const nlohmann::json& results);

// Creates `dir` when it does not exist and checks that the page can be drawn, so that a
// long run can fail before it starts. Throws InvalidArgument naming `dir` when it cannot
// be created, Error naming /usr/bin/python3 or python3-matplotlib when either is missing.
void prepare_report_dir(const std::string& dir);

// Writes `dir`/report.json, {"results": results, "charts": report_charts(results)}:
// everything the page shows; then the script draws it into `dir`/index.html. Creates `dir`
// as prepare_report_dir does; throws InvalidArgument naming a file it cannot write, Error
// with the script's message when it fails.
void write_report(const std::string& dir, const nlohmann::json& results);

}  // namespace stowage::bench
