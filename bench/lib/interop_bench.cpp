#include "interop_bench.h"

#include "bench_util.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/interop/safetensors.h>
#include <stowage/memory/accounting.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>

#include <fcntl.h>
#include <unistd.h>

namespace stowage::bench {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error(fmt::format("bench interop: cannot {} '{}': {}", what, path, std::strerror(errno)));
}

// `from` copied into a new file `to` through one buffer, then fsync'd.
void copy_file(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail("open", from);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) {
    ::close(in);
    fail("create", to);
  }
  std::vector<char> buffer(size_t(64) << 20);
  bool ok = true;
  for (;;) {
    const ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    for (ssize_t done = 0; ok && done < n;) {
      const ssize_t written = ::write(out, buffer.data() + done, static_cast<size_t>(n - done));
      ok = written > 0;
      done += written;
    }
    if (!ok) break;
  }
  ok = ok && ::fsync(out) == 0;
  ::close(in);
  ::close(out);
  if (!ok) fail("copy into", to);
}

// How far LibTorch's CPU allocations, and the process's RSS, rose above where they were
// while `fn` ran.
template <typename Fn>
std::pair<int64_t, int64_t> peaks_of(Fn&& fn) {
  memory::reset_peak_memory_stats();
  const int64_t allocated = memory::memory_allocated();
  reset_peak_rss();
  const int64_t rss = status_bytes("VmRSS");
  fn();
  return {memory::max_memory_allocated() - allocated, status_bytes("VmHWM") - rss};
}

}  // namespace

InteropBenchResult run_interop_bench(const InteropBenchOptions& options) {
  if (options.size_mib < 1 || options.tensors < 1) {
    throw InvalidArgument(fmt::format("bench interop: size_mib ({}) and tensors ({}) must be positive",
                                      options.size_mib, options.tensors));
  }
  memory::enable_accounting();
  const Scratch scratch(options.dir, "interop");
  InteropBenchResult r;
  const int64_t per_tensor = std::max<int64_t>(1, (options.size_mib << 20) / 4 / options.tensors);
  {
    StateDict state;
    for (int64_t i = 0; i < options.tensors; ++i)
      state.insert(fmt::format("layers.{}.weight", i), torch::randn({per_tensor}));
    dcp::save(state, scratch.sub("checkpoint"));
  }
  r.bytes = per_tensor * 4 * options.tensors;
  r.largest_tensor_bytes = per_tensor * 4;
  const std::string data_file =
      scratch.sub("checkpoint/" + dcp::FileSystemReader(scratch.sub("checkpoint")).read_metadata().files().at(0));
  const std::string exported = scratch.sub("model.safetensors");
  const std::string imported = scratch.sub("imported");

  auto export_once = [&] {
    std::filesystem::remove(exported);
    dcp::FileSystemReader reader(scratch.sub("checkpoint"));
    dcp::export_safetensors(reader, exported);
  };
  auto import_once = [&] {
    std::filesystem::remove_all(imported);
    dcp::import_safetensors(exported, imported);
  };
  export_once();
  std::vector<double> copy_s, export_s, import_s;
  take_turns({[&] {
                std::filesystem::remove(scratch.sub("copy.bin"));
                copy_s.push_back(seconds([&] { copy_file(data_file, scratch.sub("copy.bin")); }));
              },
              [&] { export_s.push_back(seconds(export_once)); }, [&] { import_s.push_back(seconds(import_once)); }});
  r.copy_gbps = gbps(r.bytes, median(copy_s));
  r.export_gbps = gbps(r.bytes, median(export_s));
  r.import_gbps = gbps(r.bytes, median(import_s));
  std::tie(r.export_peak_allocated_bytes, r.export_rss_growth_bytes) = peaks_of(export_once);
  std::tie(r.import_peak_allocated_bytes, r.import_rss_growth_bytes) = peaks_of(import_once);
  return r;
}

nlohmann::json to_json(const InteropBenchResult& r) {
  return {{"bytes", r.bytes},
          {"largest_tensor_bytes", r.largest_tensor_bytes},
          {"copy_gbps", r.copy_gbps},
          {"export_gbps", r.export_gbps},
          {"import_gbps", r.import_gbps},
          {"export_peak_allocated_bytes", r.export_peak_allocated_bytes},
          {"import_peak_allocated_bytes", r.import_peak_allocated_bytes},
          {"export_rss_growth_bytes", r.export_rss_growth_bytes},
          {"import_rss_growth_bytes", r.import_rss_growth_bytes}};
}

std::string to_text(const InteropBenchResult& r) {
  const double mib = 1 << 20;
  std::string out = fmt::format("interop: {:.0f} MiB in tensors of {:.1f} MiB, median of {} rounds\n", r.bytes / mib,
                                r.largest_tensor_bytes / mib, kRounds);
  out +=
      fmt::format("  plain copy {:.2f} GB/s, export {:.2f} GB/s ({:.2f} of the copy), import {:.2f} GB/s ({:.2f})\n",
                  r.copy_gbps, r.export_gbps, r.export_gbps / r.copy_gbps, r.import_gbps, r.import_gbps / r.copy_gbps);
  out += fmt::format(
      "  peak allocated: export {:.1f} MiB, import {:.1f} MiB (largest tensor {:.1f} MiB); RSS growth, mapped pages "
      "included: export {:.0f} MiB, import {:.0f} MiB",
      r.export_peak_allocated_bytes / mib, r.import_peak_allocated_bytes / mib, r.largest_tensor_bytes / mib,
      r.export_rss_growth_bytes / mib, r.import_rss_growth_bytes / mib);
  return out;
}

}  // namespace stowage::bench
