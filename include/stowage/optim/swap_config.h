#pragma once

// Options of the optimizer-state swap (stowage::optim::swap_optimizer).

#include <stowage/dcp/env.h>

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::optim {

// The logical optimizer states that can be swapped.
inline constexpr const char* kExpAvg = "exp_avg";
inline constexpr const char* kExpAvgSq = "exp_avg_sq";
inline constexpr const char* kMaxExpAvgSq = "max_exp_avg_sq";
inline constexpr const char* kMasterParam = "master_param";

// How the disk tier reads and writes its files: the file system's batch I/O (dcp/env.h;
// with kIoUring the step fails if the kernel refuses a ring).
using SwapIoPath = dcp::BatchIoPath;
const char* io_path_name(SwapIoPath path);

// The seam through which the swap makes its copies and its updates (optim/swap_env.h,
// docs/swap.md). TORCH_ARG spells its accessors `const T&`, which for a spelled-out
// `SwapEnv*` would mean a pointer to a const SwapEnv.
class SwapEnv;
using SwapEnvPointer = SwapEnv*;

struct SwapOptimizerConfig {
  // Number of batches the parameters are split into; at most two batches' states are on
  // the device at any time during step().
  TORCH_ARG(int64_t, swap_times) = 16;
  // Which states to swap, a subset of exp_avg, exp_avg_sq, max_exp_avg_sq, master_param.
  // Empty: the three moments, plus master_param when include_master_params is set.
  TORCH_ARG(std::vector<std::string>, state_keys) = {};
  // States with fewer elements stay on the device: swapping them costs more than it saves.
  TORCH_ARG(int64_t, min_numel) = 1024;
  // Also swap the fp32 master weights of an optimizer that keeps them (MasterAdamW).
  TORCH_ARG(bool, include_master_params) = false;
  // Move each batch with one copy per dtype per direction, through two device staging
  // arenas, instead of one copy per state tensor.
  TORCH_ARG(bool, packed_swap) = true;

  // Where swapped states live between steps: empty for host memory, else a directory
  // (e.g. on NVMe) in which the disk tier keeps them in scratch files of its own. Then
  // step() reads each batch one batch ahead into a pinned host buffer, uploads it, and
  // writes it back asynchronously once it has come down again.
  TORCH_ARG(std::string, swap_dir) = "";
  // Disk tier: how many host buffers of one batch each stream the states (at least two:
  // one being read while another is on its way back).
  TORCH_ARG(int64_t, buffer_count) = 4;
  // Disk tier: the host memory its buffers may take, in bytes. 0: buffer_count buffers as
  // large as swap_times makes a batch. Otherwise each buffer gets budget / buffer_count
  // bytes and the parameters are split into as many batches (at least swap_times) as it
  // takes for each batch to fit one.
  TORCH_ARG(int64_t, host_budget_bytes) = 0;
  // Disk tier: the I/O path.
  TORCH_ARG(SwapIoPath, io_path) = SwapIoPath::kAuto;
  // Disk tier: the file system its scratch files and their reads and writes go through, as
  // a checkpoint's files go through FileSystemWriterOptions::env; it must outlive the
  // optimizer. Null: dcp::Env::posix().
  TORCH_ARG(dcp::EnvPointer, file_env) = nullptr;
  // For tests: the SwapEnv to fail copies and updates through; it must outlive the
  // optimizer. Null: the real calls.
  TORCH_ARG(SwapEnvPointer, env) = nullptr;

  // Update on the host (ZeRO-Offload): the states of the parameters chosen by
  // offload_fraction stay in host memory for good and are updated there, by FusedAdamW's
  // pass; each step their gradients come down and the updated parameters go back up, and
  // the host keeps a copy of each such parameter (its fp32 master, or for fp32 parameters
  // the parameter itself). Every state is then swapped (state_keys empty; master_param
  // too, where the optimizer keeps one); not with swap_dir. docs/swap.md.
  TORCH_ARG(bool, update_on_host) = false;
  // With update_on_host: the share of the parameters' bytes updated on the host, in [0, 1],
  // the first parameters in group order; the others go through the swap's batches.
  TORCH_ARG(double, offload_fraction) = 1.0;
  // With update_on_host, on a device: each of those parameters' gradients is copied to the
  // host as backward produces it and its device memory released (the parameter's .grad()
  // is then undefined; step() uses the host's copy, and the sum over several backward
  // passes). False: the gradients stay on the device until step() downloads them, for
  // anything that must read or change them between backward and step() (a data-parallel
  // reduction, clipping). docs/swap.md ("Gradients").
  TORCH_ARG(bool, offload_gradients_in_backward) = true;

 public:
  // Throws stowage::InvalidArgument naming the offending option.
  void validate() const;
  // The states to swap, validated, in a fixed order (exp_avg, exp_avg_sq, max_exp_avg_sq,
  // master_param).
  std::vector<std::string> swapped_keys() const;
  bool disk_tier() const { return !swap_dir_.empty(); }

 private:
  void validate_update_on_host() const;
};

}  // namespace stowage::optim
