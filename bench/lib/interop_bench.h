#pragma once

// The interop benchmark: a checkpoint exported to safetensors and imported back, against
// a plain copy of the same bytes (read from the page cache, written, fsync'd: the limit
// of both), with the memory each direction allocates.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace stowage::bench {

struct InteropBenchOptions {
  int64_t size_mib = 1024;  // total size of the checkpoint
  int64_t tensors = 64;     // it is split into this many float tensors
  std::string dir;          // scratch space; empty: the system temp directory
};

struct InteropBenchResult {
  int64_t bytes = 0;
  int64_t largest_tensor_bytes = 0;
  double copy_gbps = 0;    // the checkpoint's data file copied into a new file, fsync'd
  double export_gbps = 0;  // export_safetensors into one new file (verified reads, fsync'd)
  double import_gbps = 0;  // import_safetensors into a new checkpoint, sync_files on
  // The most bytes LibTorch's CPU allocator held at once during an export and during
  // an import, above what it held before (memory::max_memory_allocated; the read-only
  // mappings of the files read are page cache, not allocations), and how far the
  // process's RSS rose over each, which counts the mapped pages the call touched too.
  int64_t export_peak_allocated_bytes = 0;
  int64_t import_peak_allocated_bytes = 0;
  int64_t export_rss_growth_bytes = 0;
  int64_t import_rss_growth_bytes = 0;
};

// Copy, export and import take turns (bench_util.h's take_turns); each figure is the
// median. Removes everything it wrote. Throws stowage::Error on a failure.
InteropBenchResult run_interop_bench(const InteropBenchOptions& options);

nlohmann::json to_json(const InteropBenchResult& result);
// Human-readable lines, with each ratio.
std::string to_text(const InteropBenchResult& result);

}  // namespace stowage::bench
