#pragma once

// The options of `stowage train`: one struct, and one list of its flags, for the command
// that parses them and for the benchmarks that run it (`stowage-bench train`, `capacity`,
// `grad-sync --zero`, `activation --train-model`), so that each field and each flag is
// declared once, a benchmark's defaults are the command's own, and the arguments a
// benchmark writes are the ones the command reads.

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::cli {

// Where the default corpus comes from: Debian's base-files package installs these
// licence texts (~260 KiB) on every machine, so training needs no download.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

struct TrainOptions {
  std::string corpus = kDefaultCorpusDir;
  std::string run_dir = "runs/default";
  int64_t steps = 200;
  int64_t batch = 16;
  int64_t seq_len = 64;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  double lr = 3e-3;
  uint64_t seed = 0;
  int threads = 2;
  int64_t recompute_segments = 2;           // 0: no activation checkpointing
  std::string selective_recompute;          // "attention-core" or "mlp": checkpoint only that part of each block
  bool offload_checkpoint_inputs = false;   // keep the checkpoints' inputs in host memory until backward
  std::string activation_budget;            // a step's activation peak ("24MiB"): the plan is picked for it
  int64_t swap_times = 4;                   // 0: plain AdamW, no optimizer-state swap
  std::string swap_to = "host";             // where swapped states live: "host" or "disk:DIR"
  std::string swap_host_budget;             // disk tier: host memory for its buffers ("256MiB"); empty: no bound
  std::string optimizer_update = "device";  // "host": the update runs on the host (ZeRO-Offload)
  double offload_fraction = 1.0;            // with "host": the share of the parameters' bytes updated there
  int64_t ckpt_every = 50;                  // 0: no checkpoints
  int64_t keep = 3;
  std::string ckpt_host_budget;   // host memory for checkpointing ("2GiB"); empty: no bound
  int64_t memory_ckpt_every = 0;  // 0: no memory tier
  std::string memory_ckpt_dir;    // empty: train::default_memory_directory(run_dir)
  bool resume = false;
  bool allow_config_change = false;  // resume a run with other --corpus, --batch, model sizes or --seed
  std::string resume_from;           // another checkpoint to start from (stowage's or PyTorch DCP's)
  int64_t log_every = 25;
  std::string cpu_cache = "1GiB";  // train::TrainerOptions::cpu_cache_bytes
  int nproc = 1;
  int nproc_per_node = 0;                    // 0: --nproc, one node
  int64_t zero_stage = 2;                    // 1: optimizer state sharded; 2: gradients too
  bool gradient_as_bucket_view = true;       // false: the reducer's buckets are a second copy of the gradients
  std::string device = "cpu";                // "cuda": each rank's cuda:LOCAL_RANK
  std::string on_save_failure = "continue";  // or "stop"
  int64_t max_save_failures = 3;             // in a row, with "continue"; 0: no limit
  std::vector<std::string> preempt_signals{"TERM"};
  std::string preempt_grace = "0s";  // 0: no deadline
};

// Adds every flag of `stowage train` to `command`, each bound to its field of `options`,
// with its check and help.
void add_train_options(CLI::App& command, TrainOptions& options);

// The arguments (after `train`) from which add_train_options's parser makes `options`: each
// flag whose field differs from a default TrainOptions's, written from the same list.
std::vector<std::string> train_arguments(const TrainOptions& options);

// `fields` of `options` as one JSON object, each under its flag's name in snake case
// ("seq_len" for --seq-len): what a benchmark reports of the runs it made, or asks its
// PyTorch peer to train. Throws InvalidArgument naming a field that is no flag's.
nlohmann::json train_options_json(const TrainOptions& options, const std::vector<std::string>& fields);

}  // namespace stowage::cli
