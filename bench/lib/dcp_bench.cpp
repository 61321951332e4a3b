#include "dcp_bench.h"

#include "bench_util.h"
#include "python_peer.h"

#include <stowage/dcp/dcp.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>

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

// The state dict run_dcp_bench measures: options.tensors float tensors of uniform values.
struct DcpBenchState {
  std::vector<at::Tensor> tensors;
  StateDict state;
  int64_t bytes = 0;
};

DcpBenchState make_dcp_bench_state(const DcpBenchOptions& options) {
  if (options.size_mib < 1 || options.tensors < 1) {
    throw InvalidArgument("bench dcp: --size-mib and the tensor count must be positive");
  }
  const int64_t numel = options.size_mib * (int64_t(1) << 20) / 4 / options.tensors;
  DcpBenchState s;
  for (int64_t i = 0; i < options.tensors; ++i) {
    s.tensors.push_back(torch::empty({numel}).uniform_());
    s.state.insert(fmt::format("layers.{}.weight", i), s.tensors.back());
  }
  s.bytes = numel * 4 * options.tensors;
  return s;
}

// PyTorch DCP's side (bench/peer/dcp_peer.py), with the same state dict as `s`.
std::unique_ptr<PythonPeer> start_dcp_peer(const DcpBenchOptions& options, const DcpBenchState& s, DcpBenchResult& r) {
  if (!options.peer) return nullptr;
  auto peer = std::make_unique<PythonPeer>("dcp_peer.py", std::vector<std::string>{});
  const nlohmann::json answer =
      peer->request({{"op", "setup"}, {"numel", s.tensors.front().numel()}, {"tensors", s.tensors.size()}});
  if (answer.at("bytes").get<int64_t>() != s.bytes) {
    throw Error(fmt::format("bench dcp: the Python peer made a state dict of {} bytes, not {}",
                            answer.at("bytes").dump(), s.bytes));
  }
  r.pytorch.emplace();
  r.pytorch->torch_version = answer.at("torch").get<std::string>();
  return peer;
}

// The staging limit (memcpy into preallocated, already touched buffers) and
// BlockingAsyncStager's staging, cached and uncached.
void time_dcp_staging(const DcpBenchState& s, DcpBenchResult& r) {
  {
    std::vector<at::Tensor> buffers;
    buffers.reserve(s.tensors.size());
    for (const at::Tensor& t : s.tensors) buffers.push_back(memory::allocate_host(t.sizes(), t.scalar_type()));
    const auto copy_all = [&] {
      for (size_t i = 0; i < s.tensors.size(); ++i)
        std::memcpy(buffers[i].data_ptr(), s.tensors[i].data_ptr(), s.tensors[i].nbytes());
    };
    copy_all();
    r.memcpy_gbps = gbps(r.bytes, best_of(3, copy_all));
  }
  {  // Right after memcpy, like it: best of 3 back to back.
    dcp::BlockingAsyncStager cached(/*cache_staged_state_dict=*/true);
    cached.stage(dcp::SaveableState(s.state));
    r.stage_cached_gbps = gbps(r.bytes, best_of(3, [&] { cached.stage(dcp::SaveableState(s.state)); }));
  }
  dcp::BlockingAsyncStager uncached;
  r.stage_uncached_gbps = gbps(r.bytes, best_of(2, [&] { uncached.stage(dcp::SaveableState(s.state)); }));
}

// A sequential write of the same bytes and one fsync, as `dd conv=fsync` measures a disk.
void write_raw(const DcpBenchState& s, const std::string& raw_path) {
  const int fd = ::open(raw_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("bench dcp: cannot create '{}'", raw_path));
  for (const at::Tensor& t : s.tensors) write_all(fd, static_cast<const char*>(t.data_ptr()), t.nbytes(), raw_path);
  ::fsync(fd);
  ::close(fd);
}

// Writes: a raw sequential write, dcp::save with two threads and with one, torch::save,
// and with a peer PyTorch DCP's dcp.save with one thread and with two. save_gbps: one
// writer thread per core of this machine, as hashing and copying into the page cache
// are CPU work; save_one_thread_gbps: the default, one thread.
void time_dcp_writes(const DcpBenchState& s, const Scratch& scratch, PythonPeer* peer, DcpBenchResult& r) {
  const std::string checkpoint = scratch.sub("checkpoint");
  const std::string raw_path = scratch.sub("raw.bin");
  const std::string torch_path = scratch.sub("torch.pt");
  dcp::FileSystemWriter writer(checkpoint, dcp::FileSystemWriterOptions().sync_files(true).thread_count(2));
  dcp::FileSystemWriter one_thread_writer(checkpoint, dcp::FileSystemWriterOptions().sync_files(true));
  std::vector<double> raw_s, save_s, one_thread_save_s, torch_s, peer_save_s, peer_two_threads_save_s;
  // Into an empty directory, as the other writers write new files: overwriting would
  // also charge dcp::save for deleting the replaced checkpoint's files.
  const auto time_save = [&](dcp::FileSystemWriter& w, std::vector<double>& times) {
    std::filesystem::remove_all(checkpoint);
    reset_peak_rss();
    const int64_t rss = status_bytes("VmRSS");
    times.push_back(seconds([&] { dcp::save(s.state, w); }));
    r.save_peak_host_bytes = std::max(r.save_peak_host_bytes, status_bytes("VmHWM") - rss);
  };
  std::vector<std::function<void()>> turns{[&] {
                                             std::filesystem::remove(raw_path);
                                             raw_s.push_back(seconds([&] { write_raw(s, raw_path); }));
                                             std::filesystem::remove(raw_path);
                                           },
                                           [&] { time_save(writer, save_s); },
                                           [&] { time_save(one_thread_writer, one_thread_save_s); },
                                           [&] {
                                             std::filesystem::remove(torch_path);
                                             // What a LibTorch user does today. torch::save does not fsync: the fsync
                                             // is ours, so that every write here reaches the disk.
                                             torch_s.push_back(seconds([&] {
                                               torch::save(s.tensors, torch_path);
                                               fsync_path(torch_path);
                                             }));
                                           }};
  if (peer != nullptr) {
    // The peer empties its directory before it starts its clock, as time_save does.
    const auto time_peer_save = [&, peer](int64_t threads, std::vector<double>& times) {
      const nlohmann::json answer =
          peer->request({{"op", "save"}, {"path", scratch.sub("pytorch_dcp")}, {"thread_count", threads}});
      times.push_back(answer.at("seconds").get<double>());
      r.pytorch->peak_host_bytes = std::max(r.pytorch->peak_host_bytes, answer.at("peak_host_bytes").get<int64_t>());
    };
    turns.emplace_back([&, time_peer_save] { time_peer_save(1, peer_save_s); });
    turns.emplace_back([&, time_peer_save] { time_peer_save(2, peer_two_threads_save_s); });
  }
  take_turns(turns);
  r.raw_write_gbps = gbps(r.bytes, median(raw_s));
  r.save_gbps = gbps(r.bytes, median(save_s));
  r.save_one_thread_gbps = gbps(r.bytes, median(one_thread_save_s));
  r.torch_save_gbps = gbps(r.bytes, median(torch_s));
  if (peer != nullptr) {
    r.pytorch->save_gbps = gbps(r.bytes, median(peer_save_s));
    r.pytorch->save_two_threads_gbps = gbps(r.bytes, median(peer_two_threads_save_s));
  }
}

// Reads, from the page cache (every file was just written): torch::load, dcp::load, and
// with a peer dcp.load of the checkpoint PyTorch DCP wrote. Like a model's parameters,
// the targets exist and have been written before the load.
void time_dcp_reads(const DcpBenchState& s, const Scratch& scratch, PythonPeer* peer, DcpBenchResult& r) {
  const std::string checkpoint = scratch.sub("checkpoint");
  const std::string torch_path = scratch.sub("torch.pt");
  StateDict target;
  for (const auto& item : s.state) target.insert(item.key(), torch::zeros_like(item.value().toTensor()));
  std::vector<double> torch_s, load_s, peer_load_s;
  std::vector<std::function<void()>> turns{
      [&] {
        std::vector<at::Tensor> loaded;
        // A job loads its checkpoint at start-up, into memory it has never used; here
        // glibc would instead hand torch::load the pages the previous round freed.
        // Returning them to the kernel first gives torch::load the conditions of a
        // fresh process.
        malloc_trim(0);
        torch_s.push_back(seconds([&] { torch::load(loaded, torch_path); }));
        if (loaded.size() != s.tensors.size() || !torch::equal(loaded.back(), s.tensors.back())) {
          throw Error("bench dcp: torch::load returned different tensors");
        }
      },
      [&] {
        load_s.push_back(seconds([&] { dcp::load(target, checkpoint); }));
        if (!torch::equal(target.at("layers.0.weight").toTensor(), s.tensors.front())) {
          throw Error("bench dcp: dcp::load returned different tensors");
        }
      }};
  if (peer != nullptr) {
    turns.emplace_back([&, peer] {  // the peer checks the values it read
      const nlohmann::json answer = peer->request({{"op", "load"}, {"path", scratch.sub("pytorch_dcp")}});
      peer_load_s.push_back(answer.at("seconds").get<double>());
    });
  }
  take_turns(turns);
  std::filesystem::remove(torch_path);
  r.torch_load_gbps = gbps(r.bytes, median(torch_s));
  r.load_gbps = gbps(r.bytes, median(load_s));
  if (peer != nullptr) r.pytorch->load_gbps = gbps(r.bytes, median(peer_load_s));
}

// How long async_save holds the caller: against a blocking cached stage, with the
// writer's cached staging, both warm; each turn starts after the previous background
// save has finished, and the two swap places every turn.
void time_dcp_async_against_stage(const DcpBenchState& s, const Scratch& scratch, DcpBenchResult& r) {
  dcp::BlockingAsyncStager cached(/*cache_staged_state_dict=*/true);
  cached.stage(dcp::SaveableState(s.state));
  dcp::FileSystemWriter writer(scratch.sub("checkpoint"), dcp::FileSystemWriterOptions().cache_staged_state_dict(true));
  dcp::async_save(s.state, writer).upload_completion.get();
  std::vector<double> stage_s, async_s;
  const auto time_stage = [&] { stage_s.push_back(seconds([&] { cached.stage(dcp::SaveableState(s.state)); })); };
  const auto time_async_save = [&] {
    dcp::AsyncSaveResponse response;  // destroying it would wait for the save
    async_s.push_back(seconds([&] { response = dcp::async_save(s.state, writer); }));
    response.upload_completion.get();
  };
  take_turns({time_stage, time_async_save});
  r.stage_s = median(stage_s);
  r.async_block_s = median(async_s);
}

// async_save with a DefaultStager (warm: its buffers cached from a first save), into an
// empty directory with sync_files on: how long it blocks the caller and when the save
// has committed; with a peer, turns with dcp.async_save and PyTorch's DefaultStager.
void time_dcp_async_default_stager(const DcpBenchState& s, const Scratch& scratch, PythonPeer* peer,
                                   DcpBenchResult& r) {
  const std::string checkpoint = scratch.sub("async");
  const std::string peer_checkpoint = scratch.sub("pytorch_dcp_async");
  dcp::FileSystemWriter writer(checkpoint, dcp::FileSystemWriterOptions().sync_files(true));
  dcp::DefaultStager stager;
  dcp::async_save(s.state, writer, &stager).upload_completion.get();
  std::vector<double> block_s, complete_s, peer_block_s, peer_complete_s;
  std::vector<std::function<void()>> turns{[&] {
    std::filesystem::remove_all(checkpoint);
    const auto start = std::chrono::steady_clock::now();
    dcp::AsyncSaveResponse response = dcp::async_save(s.state, writer, &stager);
    block_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    response.upload_completion.get();
    complete_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }};
  if (peer != nullptr) {
    peer->request({{"op", "async_save"}, {"path", peer_checkpoint}});  // warm, as stowage's
    turns.emplace_back([&, peer] {
      const nlohmann::json answer = peer->request({{"op", "async_save"}, {"path", peer_checkpoint}});
      peer_block_s.push_back(answer.at("block_s").get<double>());
      peer_complete_s.push_back(answer.at("complete_s").get<double>());
    });
  }
  take_turns(turns);
  r.async_block_default_stager_s = median(block_s);
  r.async_complete_default_stager_s = median(complete_s);
  if (peer != nullptr) {
    r.pytorch->async_block_s = median(peer_block_s);
    r.pytorch->async_complete_s = median(peer_complete_s);
  }
}

}  // namespace

DcpBenchResult run_dcp_bench(const DcpBenchOptions& options) {
  const DcpBenchState s = make_dcp_bench_state(options);
  const Scratch scratch(options.dir, "dcp");
  DcpBenchResult r;
  r.bytes = s.bytes;
  const std::unique_ptr<PythonPeer> peer = start_dcp_peer(options, s, r);
  time_dcp_staging(s, r);
  // Measurements compared by a target take turns, kRounds times, so that they meet the
  // same conditions (the disk and the cores are shared, and their speed drifts); each
  // reports the median of its turns.
  time_dcp_writes(s, scratch, peer.get(), r);
  time_dcp_reads(s, scratch, peer.get(), r);
  time_dcp_async_against_stage(s, scratch, r);
  time_dcp_async_default_stager(s, scratch, peer.get(), r);
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

namespace {

// PyTorch DCP's figures, and stowage's against them with the targets: saves at
// the same fsync policy and thread count, the load, the caller's block by async_save
// with a DefaultStager, and the peak host memory of a save.
void add_pytorch_dcp(const DcpBenchResult& r, nlohmann::json& out) {
  const PytorchDcpResult& p = *r.pytorch;
  out["pytorch_version"] = p.torch_version;
  out["pytorch_dcp_save_gbps"] = p.save_gbps;
  out["pytorch_dcp_save_two_threads_gbps"] = p.save_two_threads_gbps;
  out["pytorch_dcp_async_block_s"] = p.async_block_s;
  out["pytorch_dcp_async_complete_s"] = p.async_complete_s;
  out["pytorch_dcp_load_gbps"] = p.load_gbps;
  out["pytorch_dcp_peak_host_bytes"] = p.peak_host_bytes;
  out["peak_host_measure"] = "rss_high_water_above_start";
  out["save_one_thread_over_pytorch_dcp"] = r.save_one_thread_gbps / p.save_gbps;
  out["save_one_thread_over_pytorch_dcp_met"] = r.save_one_thread_gbps >= 2 * p.save_gbps;
  out["save_two_threads_over_pytorch_dcp"] = r.save_gbps / p.save_two_threads_gbps;
  out["save_two_threads_over_pytorch_dcp_met"] = r.save_gbps >= 2 * p.save_two_threads_gbps;
  out["load_over_pytorch_dcp"] = r.load_gbps / p.load_gbps;
  out["load_over_pytorch_dcp_met"] = r.load_gbps >= 2 * p.load_gbps;
  out["async_block_over_pytorch_dcp"] = r.async_block_default_stager_s / p.async_block_s;
  out["async_block_over_pytorch_dcp_met"] = r.async_block_default_stager_s <= p.async_block_s;
  out["peak_host_over_pytorch_dcp"] =
      static_cast<double>(r.save_peak_host_bytes) / static_cast<double>(std::max<int64_t>(p.peak_host_bytes, 1));
  out["peak_host_over_pytorch_dcp_met"] = r.save_peak_host_bytes <= p.peak_host_bytes;
}

// One line of the targets: a figure against its limit, and whether it is met.
std::string dcp_target_line(const char* name, double value, double limit, const char* relation) {
  const bool met = std::string(relation) == ">=" ? value >= limit : value <= limit;
  return fmt::format("  {:<44} {:8.3f} {} {:8.3f}  {}\n", name, value, relation, limit, met ? "met" : "NOT met");
}

// PyTorch DCP's figures beside stowage's, and the targets against them.
std::string pytorch_dcp_text(const DcpBenchResult& r) {
  std::string out;
  const PytorchDcpResult& p = *r.pytorch;
  out += fmt::format("PyTorch DCP (torch {}), same state dict, turns taken with stowage's:\n", p.torch_version);
  out += fmt::format("  save {:.2f} GB/s (two threads: {:.2f}), load {:.2f} GB/s\n", p.save_gbps,
                     p.save_two_threads_gbps, p.load_gbps);
  out += fmt::format(
      "  async_save with DefaultStager blocks {:.4f} s, completes in {:.3f} s (stowage: {:.4f} s, {:.3f} s)\n",
      p.async_block_s, p.async_complete_s, r.async_block_default_stager_s, r.async_complete_default_stager_s);
  out += fmt::format(
      "  peak host memory of a save (RSS high-water mark above the start): {:.1f} MiB (stowage: {:.1f} MiB)\n",
      p.peak_host_bytes / 1048576.0, r.save_peak_host_bytes / 1048576.0);
  out += "targets against PyTorch DCP:\n";
  out += dcp_target_line("save_one_thread_gbps >= 2 x PyTorch DCP's", r.save_one_thread_gbps, 2 * p.save_gbps, ">=");
  out +=
      dcp_target_line("save_gbps (two threads) >= 2 x PyTorch DCP's", r.save_gbps, 2 * p.save_two_threads_gbps, ">=");
  out += dcp_target_line("load_gbps >= 2 x PyTorch DCP's", r.load_gbps, 2 * p.load_gbps, ">=");
  out += dcp_target_line("async_block (DefaultStager) ms <= PyTorch's", r.async_block_default_stager_s * 1e3,
                         p.async_block_s * 1e3, "<=");
  out += dcp_target_line("save_peak_host MiB <= PyTorch DCP's", r.save_peak_host_bytes / 1048576.0,
                         p.peak_host_bytes / 1048576.0, "<=");
  return out;
}

}  // namespace

nlohmann::json to_json(const DcpBenchResult& r) {
  nlohmann::json out{{"bytes", r.bytes},
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
                     {"async_block_default_stager_s", r.async_block_default_stager_s},
                     {"async_complete_default_stager_s", r.async_complete_default_stager_s},
                     {"save_peak_host_bytes", r.save_peak_host_bytes}};
  if (r.pytorch) add_pytorch_dcp(r, out);
  return out;
}

std::string to_text(const DcpBenchResult& r) {
  std::string out = fmt::format("dcp benchmark: {:.0f} MiB in one state dict\n", r.bytes / 1048576.0);
  out += fmt::format("  memcpy {:.2f} GB/s, stage cached {:.2f}, uncached {:.2f}\n", r.memcpy_gbps, r.stage_cached_gbps,
                     r.stage_uncached_gbps);
  out += fmt::format("  save {:.2f} GB/s (one thread: {:.2f}), raw write {:.2f}, torch::save {:.2f}\n", r.save_gbps,
                     r.save_one_thread_gbps, r.raw_write_gbps, r.torch_save_gbps);
  out += fmt::format("  load {:.2f} GB/s, torch::load {:.2f}\n", r.load_gbps, r.torch_load_gbps);
  out += fmt::format(
      "  async_save blocks {:.3f} s (DefaultStager: {:.4f} s, committed after {:.3f} s); a blocking stage takes {:.3f} "
      "s\n",
      r.async_block_s, r.async_block_default_stager_s, r.async_complete_default_stager_s, r.stage_s);
  out += fmt::format("  peak host memory of a save: {:.1f} MiB above the RSS at its start\n",
                     r.save_peak_host_bytes / 1048576.0);
  out += "targets:\n";
  out += dcp_target_line("stage_cached_gbps >= 0.8 x memcpy_gbps", r.stage_cached_gbps, 0.8 * r.memcpy_gbps, ">=");
  out += dcp_target_line("save_gbps >= 0.9 x raw_write_gbps", r.save_gbps, 0.9 * r.raw_write_gbps, ">=");
  out += dcp_target_line("save_gbps >= 2 x torch_save_gbps", r.save_gbps, 2 * r.torch_save_gbps, ">=");
  out += dcp_target_line("load_gbps >= 2 x torch_load_gbps", r.load_gbps, 2 * r.torch_load_gbps, ">=");
  out += dcp_target_line("async_block_s <= 1.1 x stage_s", r.async_block_s, 1.1 * r.stage_s, "<=");
  if (r.pytorch) out += pytorch_dcp_text(r);
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
      buffers.push_back(memory::allocate_host(t.sizes(), t.scalar_type(),
                                              {/*pin_memory=*/true, /*share_memory=*/false, device.type()}));
    }
    const auto copy_all = [&] {
      for (size_t i = 0; i < tensors.size(); ++i) buffers[i].copy_(tensors[i]);
      synchronize(device);
    };
    copy_all();
    r.copy_limit_gbps = gbps(r.bytes, best_of(3, copy_all));
  }
  dcp::DefaultStager stager;
  const int64_t host_before = memory::host_buffer_stats().current_bytes;
  const int64_t device_before = memory::memory_allocated(device);
  memory::reset_peak_memory_stats(device);
  stager.stage(dcp::SaveableState(state));  // allocates the cached buffers
  r.staging_host_bytes = memory::host_buffer_stats().current_bytes - host_before;
  r.staging_device_peak_bytes = memory::max_memory_allocated(device) - device_before;
  r.stage_gbps = gbps(r.bytes, best_of(3, [&] { stager.stage(dcp::SaveableState(state)); }));
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
          {"async_complete_s", r.async_complete_s},
          {"staging_host_bytes", r.staging_host_bytes},
          {"staging_device_peak_bytes", r.staging_device_peak_bytes}};
}

}  // namespace stowage::bench
