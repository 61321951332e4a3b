#include "dcp_bench.h"

#include "bench_util.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

namespace stowage::bench {
namespace {

template <typename Fn>
double best_of(int repetitions, Fn&& fn) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repetitions; ++i) best = std::min(best, seconds(fn));
  return best;
}

void write_all(int fd, const char* data, int64_t length, const std::string& path) {
  while (length > 0) {
    const ssize_t n = ::write(fd, data, static_cast<size_t>(std::min<int64_t>(length, int64_t(1) << 30)));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("bench dcp: cannot write '{}': {}", path, std::strerror(errno)));
    }
    data += n;
    length -= n;
  }
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    throw Error(fmt::format("bench dcp: cannot fsync '{}': {}", path, std::strerror(errno)));
  }
  ::close(fd);
}

}  // namespace

DcpBenchResult run_dcp_bench(const DcpBenchOptions& options) {
  if (options.size_mib < 1 || options.tensors < 1) {
    throw InvalidArgument("bench dcp: --size-mib and the tensor count must be positive");
  }
  const Scratch scratch(options.dir, "dcp");
  const int64_t numel = options.size_mib * (int64_t(1) << 20) / 4 / options.tensors;
  std::vector<at::Tensor> tensors;
  StateDict state;
  for (int64_t i = 0; i < options.tensors; ++i) {
    tensors.push_back(torch::empty({numel}).uniform_());
    state.insert(fmt::format("layers.{}.weight", i), tensors.back());
  }
  DcpBenchResult r;
  r.bytes = numel * 4 * options.tensors;

  {  // The staging limit: memcpy into preallocated, already touched buffers.
    std::vector<at::Tensor> buffers;
    buffers.reserve(tensors.size());
    for (const at::Tensor& t : tensors) buffers.push_back(memory::allocate_host(t.sizes(), t.scalar_type()));
    const auto copy_all = [&] {
      for (size_t i = 0; i < tensors.size(); ++i)
        std::memcpy(buffers[i].data_ptr(), tensors[i].data_ptr(), tensors[i].nbytes());
    };
    copy_all();
    r.memcpy_gbps = gbps(r.bytes, best_of(3, copy_all));
  }
  {  // Right after memcpy, like it: best of 3 back to back.
    dcp::BlockingAsyncStager cached(/*cache_staged_state_dict=*/true);
    cached.stage(state);
    r.stage_cached_gbps = gbps(r.bytes, best_of(3, [&] { cached.stage(state); }));
  }
  {
    dcp::BlockingAsyncStager uncached;
    r.stage_uncached_gbps = gbps(r.bytes, best_of(2, [&] { uncached.stage(state); }));
  }
  // Measurements compared by a target take turns, kRounds times, so that they meet the
  // same conditions (the disk and the cores are shared, and their speed drifts); each
  // reports the median of its turns.
  const std::string checkpoint = scratch.sub("checkpoint");
  const std::string raw_path = scratch.sub("raw.bin");
  const std::string torch_path = scratch.sub("torch.pt");
  {  // Writes: a raw sequential write, dcp::save with two threads and with one, torch::save.
    // save_gbps: one writer thread per core of this machine, as hashing and copying into
    // the page cache are CPU work; save_one_thread_gbps: the default, one thread.
    dcp::FileSystemWriter writer(checkpoint, dcp::FileSystemWriterOptions().sync_files(true).thread_count(2));
    dcp::FileSystemWriter one_thread_writer(checkpoint, dcp::FileSystemWriterOptions().sync_files(true));
    std::vector<double> raw_s, save_s, one_thread_save_s, torch_s;
    // Into an empty directory, as the other writers write new files: overwriting would
    // also charge dcp::save for deleting the replaced checkpoint's files.
    const auto time_save = [&](dcp::FileSystemWriter& w, std::vector<double>& times) {
      std::filesystem::remove_all(checkpoint);
      times.push_back(seconds([&] { dcp::save(state, w); }));
    };
    take_turns({[&] {
                  std::filesystem::remove(raw_path);
                  raw_s.push_back(seconds([&] {
                    const int fd = ::open(raw_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                    if (fd < 0) throw Error(fmt::format("bench dcp: cannot create '{}'", raw_path));
                    // Sequential writes and one fsync, as `dd conv=fsync` measures a disk.
                    for (const at::Tensor& t : tensors) {
                      write_all(fd, static_cast<const char*>(t.data_ptr()), t.nbytes(), raw_path);
                    }
                    ::fsync(fd);
                    ::close(fd);
                  }));
                  std::filesystem::remove(raw_path);
                },
                [&] { time_save(writer, save_s); }, [&] { time_save(one_thread_writer, one_thread_save_s); },
                [&] {
                  std::filesystem::remove(torch_path);
                  // What a LibTorch user does today. torch::save does not fsync: the fsync is
                  // ours, so that every write here reaches the disk.
                  torch_s.push_back(seconds([&] {
                    torch::save(tensors, torch_path);
                    fsync_path(torch_path);
                  }));
                }});
    r.raw_write_gbps = gbps(r.bytes, median(raw_s));
    r.save_gbps = gbps(r.bytes, median(save_s));
    r.save_one_thread_gbps = gbps(r.bytes, median(one_thread_save_s));
    r.torch_save_gbps = gbps(r.bytes, median(torch_s));
  }
  {  // Reads, from the page cache (both files were just written): torch::load, dcp::load.
    // Like a model's parameters, the targets exist and have been written before the load.
    StateDict target;
    for (const auto& item : state) target.insert(item.key(), torch::zeros_like(item.value().toTensor()));
    std::vector<double> torch_s, load_s;
    const auto time_torch_load = [&] {
      std::vector<at::Tensor> loaded;
      // A job loads its checkpoint at start-up, into memory it has never used; here glibc
      // would instead hand torch::load the pages the previous round freed. Returning them
      // to the kernel first gives torch::load the conditions of a fresh process.
      malloc_trim(0);
      torch_s.push_back(seconds([&] { torch::load(loaded, torch_path); }));
      if (loaded.size() != tensors.size() || !torch::equal(loaded.back(), tensors.back())) {
        throw Error("bench dcp: torch::load returned different tensors");
      }
    };
    const auto time_load = [&] {
      load_s.push_back(seconds([&] { dcp::load(target, checkpoint); }));
      if (!torch::equal(target.at("layers.0.weight").toTensor(), tensors.front())) {
        throw Error("bench dcp: dcp::load returned different tensors");
      }
    };
    take_turns({time_torch_load, time_load});
    std::filesystem::remove(torch_path);
    r.torch_load_gbps = gbps(r.bytes, median(torch_s));
    r.load_gbps = gbps(r.bytes, median(load_s));
  }
  {  // A blocking cached stage, and how long async_save holds the caller with the
     // writer's cached staging, both warm; each turn starts after the previous
     // background save has finished, and the two swap places every turn.
    dcp::BlockingAsyncStager cached(/*cache_staged_state_dict=*/true);
    cached.stage(state);
    dcp::FileSystemWriter writer(checkpoint, dcp::FileSystemWriterOptions().cache_staged_state_dict(true));
    dcp::async_save(state, writer).upload_completion.get();
    std::vector<double> stage_s, async_s;
    const auto time_stage = [&] { stage_s.push_back(seconds([&] { cached.stage(state); })); };
    const auto time_async_save = [&] {
      dcp::AsyncSaveResponse response;  // destroying it would wait for the save
      async_s.push_back(seconds([&] { response = dcp::async_save(state, writer); }));
      response.upload_completion.get();
    };
    take_turns({time_stage, time_async_save});
    r.stage_s = median(stage_s);
    r.async_block_s = median(async_s);
    dcp::DefaultStager stager;
    dcp::AsyncSaveResponse response;
    dcp::async_save(state, writer, &stager).upload_completion.get();
    r.async_block_default_stager_s = seconds([&] { response = dcp::async_save(state, writer, &stager); });
    response.upload_completion.get();
  }
  return r;
}

double run_dcp_rank_save_bench(const DcpBenchOptions& options, const std::string& checkpoint_dir,
                               const dist::ProcessGroup& group) {
  const int64_t ranks = group.size();
  const int64_t cols = 1024;
  const int64_t rows_per_rank =
      std::max<int64_t>(1, options.size_mib * (int64_t(1) << 20) / 4 / cols / options.tensors / ranks);
  StateDict state;
  for (int64_t i = 0; i < options.tensors; ++i) {
    state.insert(fmt::format("layers.{}.weight", i),
                 dcp::sharded_tensor(torch::empty({rows_per_rank, cols}).uniform_(), {rows_per_rank * ranks, cols},
                                     {rows_per_rank * group.rank(), 0}));
  }
  const int64_t total_bytes = rows_per_rank * ranks * cols * 4 * options.tensors;
  dcp::FileSystemWriter writer(checkpoint_dir, dcp::FileSystemWriterOptions().sync_files(true));
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    group.barrier();
    const double mine = seconds([&] { dcp::save(state, writer, group); });
    double slowest = 0;
    for (const std::string& time : group.all_gather(std::to_string(mine))) slowest = std::max(slowest, std::stod(time));
    best = std::min(best, slowest);
  }
  return gbps(total_bytes, best);
}

SmallEntriesBenchResult run_small_entries_bench(int64_t entries, int turns, const std::string& dir) {
  if (entries < 1 || turns < 1) throw InvalidArgument("bench dcp: the entry and turn counts must be positive");
  const Scratch scratch(dir, "dcp");
  std::vector<at::Tensor> tensors;
  StateDict state, target;
  for (int64_t i = 0; i < entries; ++i) {
    tensors.push_back(torch::empty({16}).uniform_());
    state.insert(fmt::format("layers.{}.weight", i), tensors.back());
    target.insert(fmt::format("layers.{}.weight", i), torch::zeros({16}));
  }
  SmallEntriesBenchResult r;
  r.entries = entries;
  r.data_bytes = entries * 16 * 4;
  const std::string checkpoint = scratch.sub("checkpoint");
  const std::string torch_path = scratch.sub("torch.pt");
  std::vector<double> save_s, torch_save_s, load_s, torch_load_s;
  for (int turn = 0; turn < turns; ++turn) {
    std::filesystem::remove_all(checkpoint);
    std::filesystem::remove(torch_path);
    const auto time_save = [&] { save_s.push_back(seconds([&] { dcp::save(state, checkpoint); })); };
    const auto time_torch_save = [&] {
      torch_save_s.push_back(seconds([&] {
        torch::save(tensors, torch_path);
        fsync_path(torch_path);
      }));
    };
    run_round(turn, {time_save, time_torch_save});
    const auto time_load = [&] { load_s.push_back(seconds([&] { dcp::load(target, checkpoint); })); };
    const auto time_torch_load = [&] {
      std::vector<at::Tensor> loaded;
      malloc_trim(0);  // fresh memory, as in run_dcp_bench
      torch_load_s.push_back(seconds([&] { torch::load(loaded, torch_path); }));
      if (loaded.size() != tensors.size() || !torch::equal(loaded.back(), tensors.back())) {
        throw Error("bench dcp: torch::load returned different tensors");
      }
    };
    run_round(turn, {time_load, time_torch_load});
    if (!torch::equal(target.at(fmt::format("layers.{}.weight", entries - 1)).toTensor(), tensors.back())) {
      throw Error("bench dcp: dcp::load returned different tensors");
    }
  }
  r.metadata_bytes = static_cast<int64_t>(std::filesystem::file_size(checkpoint + "/" + dcp::kMetadataFileName));
  r.save_s = median(save_s);
  r.torch_save_s = median(torch_save_s);
  r.load_s = median(load_s);
  r.torch_load_s = median(torch_load_s);
  return r;
}

nlohmann::json to_json(const SmallEntriesBenchResult& r) {
  return nlohmann::json{{"entries", r.entries},
                        {"data_bytes", r.data_bytes},
                        {"metadata_bytes", r.metadata_bytes},
                        {"save_s", r.save_s},
                        {"torch_save_s", r.torch_save_s},
                        {"load_s", r.load_s},
                        {"torch_load_s", r.torch_load_s}};
}

std::string to_text(const SmallEntriesBenchResult& r) {
  std::string out =
      fmt::format("dcp benchmark: {} tensors of 16 floats ({:.1f} MiB)\n", r.entries, r.data_bytes / 1048576.0);
  out += fmt::format("  metadata {} bytes, {:.1f} per entry\n", r.metadata_bytes,
                     static_cast<double>(r.metadata_bytes) / static_cast<double>(r.entries));
  out += fmt::format("  save {:.3f} s, torch::save {:.3f} s\n", r.save_s, r.torch_save_s);
  out += fmt::format("  load {:.3f} s, torch::load {:.3f} s\n", r.load_s, r.torch_load_s);
  return out;
}

nlohmann::json to_json(const DcpBenchResult& r) {
  return nlohmann::json{{"bytes", r.bytes},
                        {"memcpy_gbps", r.memcpy_gbps},
                        {"stage_cached_gbps", r.stage_cached_gbps},
                        {"stage_uncached_gbps", r.stage_uncached_gbps},
                        {"save_gbps", r.save_gbps},
                        {"save_one_thread_gbps", r.save_one_thread_gbps},
                        {"raw_write_gbps", r.raw_write_gbps},
                        {"torch_save_gbps", r.torch_save_gbps},
                        {"load_gbps", r.load_gbps},
                        {"torch_load_gbps", r.torch_load_gbps},
                        {"async_block_s", r.async_block_s},
                        {"stage_s", r.stage_s},
                        {"async_block_default_stager_s", r.async_block_default_stager_s}};
}

std::string to_text(const DcpBenchResult& r) {
  const auto target = [](const char* name, double value, double limit, const char* relation) {
    const bool met = std::string(relation) == ">=" ? value >= limit : value <= limit;
    return fmt::format("  {:<44} {:8.3f} {} {:8.3f}  {}\n", name, value, relation, limit, met ? "met" : "NOT met");
  };
  std::string out = fmt::format("dcp benchmark: {:.0f} MiB in one state dict\n", r.bytes / 1048576.0);
  out += fmt::format("  memcpy {:.2f} GB/s, stage cached {:.2f}, uncached {:.2f}\n", r.memcpy_gbps, r.stage_cached_gbps,
                     r.stage_uncached_gbps);
  out += fmt::format("  save {:.2f} GB/s (one thread: {:.2f}), raw write {:.2f}, torch::save {:.2f}\n", r.save_gbps,
                     r.save_one_thread_gbps, r.raw_write_gbps, r.torch_save_gbps);
  out += fmt::format("  load {:.2f} GB/s, torch::load {:.2f}\n", r.load_gbps, r.torch_load_gbps);
  out += fmt::format("  async_save blocks {:.3f} s (DefaultStager: {:.4f} s); a blocking stage takes {:.3f} s\n",
                     r.async_block_s, r.async_block_default_stager_s, r.stage_s);
  out += "targets:\n";
  out += target("stage_cached_gbps >= 0.8 x memcpy_gbps", r.stage_cached_gbps, 0.8 * r.memcpy_gbps, ">=");
  out += target("save_gbps >= 0.9 x raw_write_gbps", r.save_gbps, 0.9 * r.raw_write_gbps, ">=");
  out += target("save_gbps >= 2 x torch_save_gbps", r.save_gbps, 2 * r.torch_save_gbps, ">=");
  out += target("load_gbps >= 2 x torch_load_gbps", r.load_gbps, 2 * r.torch_load_gbps, ">=");
  out += target("async_block_s <= 1.1 x stage_s", r.async_block_s, 1.1 * r.stage_s, "<=");
  return out;
}

}  // namespace stowage::bench

namespace stowage::bench {

DeviceStagingResult run_device_staging_bench(const DcpBenchOptions& options, c10::Device device) {
  if (options.size_mib < 1 || options.tensors < 1) {
    throw InvalidArgument("bench dcp: --size-mib and the tensor count must be positive");
  }
  const Scratch scratch(options.dir, "dcp");
  const int64_t numel = options.size_mib * (int64_t(1) << 20) / 4 / options.tensors;
  StateDict state;
  std::vector<at::Tensor> tensors;
  for (int64_t i = 0; i < options.tensors; ++i) {
    tensors.push_back(torch::empty({numel}, torch::TensorOptions().device(device)).uniform_());
    state.insert(fmt::format("layers.{}.weight", i), tensors.back());
  }
  synchronize(device);
  DeviceStagingResult r;
  r.device = device.str();
  r.bytes = numel * 4 * options.tensors;
  {  // The limit: plain copies into preallocated pinned host buffers.
    std::vector<at::Tensor> buffers;
    buffers.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      buffers.push_back(memory::allocate_host(t.sizes(), t.scalar_type(), {/*pin_memory=*/true, false}));
    }
    const auto copy_all = [&] {
      for (size_t i = 0; i < tensors.size(); ++i) buffers[i].copy_(tensors[i]);
      synchronize(device);
    };
    copy_all();
    r.copy_limit_gbps = gbps(r.bytes, best_of(3, copy_all));
  }
  dcp::DefaultStager stager;
  stager.stage(state);  // allocates the cached buffers
  r.stage_gbps = gbps(r.bytes, best_of(3, [&] { stager.stage(state); }));
  dcp::FileSystemWriter writer(scratch.sub("checkpoint"));
  const auto start = std::chrono::steady_clock::now();
  dcp::AsyncSaveResponse response = dcp::async_save(state, writer, &stager);
  r.async_block_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  response.upload_completion.get();
  r.async_complete_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

nlohmann::json to_json(const DeviceStagingResult& r) {
  return {{"device", r.device},
          {"bytes", r.bytes},
          {"copy_limit_gbps", r.copy_limit_gbps},
          {"stage_gbps", r.stage_gbps},
          {"stage_over_limit", r.stage_gbps / r.copy_limit_gbps},
          {"async_block_s", r.async_block_s},
          {"async_complete_s", r.async_complete_s}};
}

}  // namespace stowage::bench
