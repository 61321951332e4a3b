#pragma once

// The dcp benchmark: staging, save and load of one state dict against the limits of
// this machine (memcpy, a raw sequential write) and against torch::save/torch::load,
// all measured in the same run.

#include <stowage/dist/process_group.h>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace stowage::bench {

struct DcpBenchOptions {
  int64_t size_mib = 1024;  // total size of the state dict
  int64_t tensors = 64;     // it is split into this many float tensors
  std::string dir;          // scratch space; empty: the system temp directory
  // Also measure PyTorch DCP (bench/peer/dcp_peer.py, the torch wheel's Python) on the
  // same state dict, its rounds taking turns with stowage's; needs python_peer_available().
  bool peer = false;
};

// PyTorch DCP's figures on the same state dict, in the same directory, measured as the
// corresponding stowage figures are (medians of turns taken with them).
struct PytorchDcpResult {
  std::string torch_version;
  double save_gbps = 0;              // dcp.save, FileSystemWriter(sync_files=True), thread_count 1
  double save_two_threads_gbps = 0;  // the same with thread_count 2
  double async_block_s = 0;          // caller blocked by dcp.async_save with a DefaultStager
  double async_complete_s = 0;       // until that save's upload completed
  double load_gbps = 0;              // dcp.load into pre-allocated tensors (values checked)
  int64_t peak_host_bytes = 0;       // of a save: as DcpBenchResult::save_peak_host_bytes
};

struct DcpBenchResult {
  int64_t bytes = 0;
  double memcpy_gbps = 0;                      // copy into preallocated buffers: the staging limit
  double stage_cached_gbps = 0;                // BlockingAsyncStager, cached buffers, warm
  double stage_uncached_gbps = 0;              // BlockingAsyncStager, new buffers every call
  double save_gbps = 0;                        // dcp::save into an empty directory, sync_files on, 2 threads
  double save_one_thread_gbps = 0;             // the same with the default thread_count, 1
  double raw_write_gbps = 0;                   // the same bytes written sequentially + one fsync (dd conv=fsync)
  double torch_save_gbps = 0;                  // torch::save of the same tensors + fsync
  double load_gbps = 0;                        // dcp::load into preallocated tensors (checksums verified)
  double torch_load_gbps = 0;                  // torch::load of the torch::save file into fresh memory, as at start-up
  double async_block_s = 0;                    // caller blocked by async_save (writer's cached staging)
  double stage_s = 0;                          // a blocking cached stage of the same state
  double async_block_default_stager_s = 0;     // caller blocked by async_save with a DefaultStager
  double async_complete_default_stager_s = 0;  // until that save committed
  // Of a save (either thread count, the largest of the turns): how far the process's RSS
  // high-water mark rose above its RSS at the start (/proc/self/status VmHWM - VmRSS).
  int64_t save_peak_host_bytes = 0;
  std::optional<PytorchDcpResult> pytorch;  // with DcpBenchOptions::peer
};

// Runs every measurement; those a target compares (writes, reads, async_save against a
// stage) take turns over a few rounds and report their medians, the others the best
// of a few repetitions. Removes everything it wrote. Throws stowage::Error on a failure.
DcpBenchResult run_dcp_bench(const DcpBenchOptions& options);

// One rank's part of the distributed save measurement, run by every rank of `group`:
// each saves its row shards of options.tensors global tensors (options.size_mib in
// all, split evenly over the ranks) into `checkpoint_dir`, sync_files on. Returns the
// aggregate GB/s (all bytes over the slowest rank's time, best of 3), on every rank.
double run_dcp_rank_save_bench(const DcpBenchOptions& options, const std::string& checkpoint_dir,
                               const dist::ProcessGroup& group);

nlohmann::json to_json(const DcpBenchResult& result);
// Human-readable lines, with each target and whether it is met.
std::string to_text(const DcpBenchResult& result);

// Many small entries, where the metadata rather than the data dominates: `entries`
// tensors of 16 floats ("layers.<i>.weight"), saved and loaded by dcp and by
// torch::save/torch::load (a vector of the same tensors), each the median of `turns`
// (torch::save and torch::load take time quadratic in the tensor count: 100,000 take
// minutes each).
struct SmallEntriesBenchResult {
  int64_t entries = 0;
  int64_t data_bytes = 0;      // the tensors' bytes
  int64_t metadata_bytes = 0;  // the checkpoint's metadata file
  double save_s = 0;           // dcp::save into an empty directory, sync_files on
  double torch_save_s = 0;     // torch::save + fsync
  double load_s = 0;           // dcp::load into preallocated tensors
  double torch_load_s = 0;     // torch::load into fresh memory
};
SmallEntriesBenchResult run_small_entries_bench(int64_t entries, int turns = 3, const std::string& dir = "");
nlohmann::json to_json(const SmallEntriesBenchResult& result);
std::string to_text(const SmallEntriesBenchResult& result);

// Staging from a device (`bench dcp --device`): `size_mib` in options.tensors float
// tensors on `device`, staged into host memory by DefaultStager (pinned where the build
// can pin) against the device-to-host copy limit, and how long async_save blocks the
// caller. On the CPU the limit is a memcpy.
struct DeviceStagingResult {
  std::string device;
  int64_t bytes = 0;
  double copy_limit_gbps = 0;             // tensor.copy_ into preallocated pinned buffers, one after another
  double stage_gbps = 0;                  // DefaultStager::stage, its buffers cached from an earlier call
  double async_block_s = 0;               // caller blocked by async_save with that DefaultStager
  double async_complete_s = 0;            // until that save committed
  int64_t staging_host_bytes = 0;         // the stager's cached host buffers
  int64_t staging_device_peak_bytes = 0;  // device memory staging took beyond the state's own
};
DeviceStagingResult run_device_staging_bench(const DcpBenchOptions& options, c10::Device device);
nlohmann::json to_json(const DeviceStagingResult& result);

}  // namespace stowage::bench
