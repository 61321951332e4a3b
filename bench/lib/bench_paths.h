#pragma once

// The paths of this checkout and build that the benchmarks need: the report's plotting
// script, the Python peers' scripts and the torch wheel's Python that runs them. CMake
// writes them into a source of the build folder (bench/lib/bench_paths.cpp.in), not into
// -D definitions: a definition that names the checkout keys its units' compiler-cache
// entries by it, and a clone at another path (CI's) would then recompile them.

#include <string>

namespace stowage::bench::paths {

std::string report_script();  // bench/report/plot_report.py
std::string peer_scripts();   // bench/peer; empty when built without the wheel's Python
std::string python();         // the torch wheel's Python; empty when built without it

}  // namespace stowage::bench::paths
