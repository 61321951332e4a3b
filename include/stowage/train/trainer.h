#pragma once

// A training loop's protocol, owned by the library: the user's loop keeps its model, its
// data, its forward and its loss, and calls a Trainer around each step, which does the
// rest — join the job and pick the rank's device, shard the optimizer (ZeRO-1/2, with
// the swap), average the gradients, keep replicated buffers in sync, restore (with the
// fallback report and the run's configuration checked), keep every generator (the data's,
// the CPU's, the device's), wait for staging before the update, save every K steps and
// at the last, report failed saves by the policy, agree on preemption across ranks and
// save that step, and give the exit status. The role of Lightning Fabric and of
// DeepSpeed's engine, for LibTorch:
//
//   train::Trainer trainer(train::TrainerOptions("runs/mine").steps(1000).resume(resume));
//   Model model(...);  // initialised alike on every rank (seeded), then moved
//   model->to(trainer.device());
//   at::Generator data = at::make_generator<at::CPUGeneratorImpl>(seed);
//   trainer.prepare(model.ptr(), make_adamw, data);
//   for (int64_t step = trainer.restore(); step <= 1000; ++step) {
//     trainer.begin_step();
//     auto loss = loss_of(model, next_batch(data, trainer.world()));
//     loss.backward();
//     if (!trainer.end_step(step, loss.item<double>())) break;  // preempted, step saved
//   }
//   return trainer.finish();  // 0, 1 (the last save failed) or dist::kPreemptedStatus
//
// Everything that must be equal on every rank is: each rank draws the same data stream
// (the global batch) and takes its slice, and initialises its model from the same seed.
// Activation checkpointing stays in the user's forward (activation::checkpoint_sequential,
// apply_activation_checkpointing or fit_activation_budget before prepare()).
//
// Thread safety: one thread calls a Trainer. REQUIRES: one Trainer per process at a time
// (its dist::PreemptionNotice catches process-wide signals).

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/dcp/memory_tier.h>
#include <stowage/dist/preemption.h>
#include <stowage/dist/world.h>
#include <stowage/optim/swap_config.h>
#include <stowage/optim/zero_redundancy_optimizer.h>
#include <stowage/train/events.h>
#include <stowage/train/run_directory.h>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace stowage::train {

struct TrainerOptions {
  explicit TrainerOptions(std::string run_dir) : run_dir_(std::move(run_dir)) {}

  // The run's directory: metrics.jsonl, run.json (its configuration), checkpoints/.
  TORCH_ARG(std::string, run_dir);
  // The last step: saved when reached, whatever save_every says (unless save_every is 0).
  TORCH_ARG(int64_t, steps) = 1;
  // Where this rank trains; an accelerator without an index is the one of LOCAL_RANK
  // (dist::rank_device).
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  // Continue from the run directory's latest committed checkpoint (none: from step 0).
  // Without it, a run directory that holds a run already is refused.
  TORCH_ARG(bool, resume) = false;
  // Start from another checkpoint: one a Trainer wrote gives model, optimizer and
  // progress; any other the model alone. Not with resume.
  TORCH_ARG(std::string, resume_from) = "";
  // How resume_from is read: stowage's format by default; interop::open_checkpoint reads
  // PyTorch DCP's too.
  using CheckpointOpener = std::function<std::unique_ptr<dcp::StorageReader>(const std::string& path)>;
  TORCH_ARG(CheckpointOpener, open_checkpoint) = [](const std::string& path) {
    return std::make_unique<dcp::FileSystemReader>(path);
  };
  // What shapes the model or the data (name → value), recorded in run.json at the start
  // and compared on resume (run_directory.h).
  TORCH_ARG(RunConfig, config) = {};
  TORCH_ARG(bool, allow_config_change) = false;
  // Checkpoints into <run_dir>/checkpoints; save_every 0: none at all.
  TORCH_ARG(dcp::CheckpointManagerOptions, checkpoints) = {};
  // Checkpoints in host memory, replicated to a peer node (dcp/memory_tier.h), every
  // save_every steps; 0: none. An empty directory is default_memory_directory(run_dir).
  // A resume restores the newest step every rank can get from memory, a peer's replica
  // or storage; a run that ends with every step trained removes its memory checkpoints.
  TORCH_ARG(dcp::MemoryTierOptions, memory_checkpoints) = {};
  // Host memory each rank's checkpointing may hold (0: no bound): the staging of storage
  // saves plus the memory tier's own checkpoints and replicas. The tier's share is
  // reserved for its most (keep_last + 1 checkpoints of this rank's state, as many
  // replicas of its source's and a replication's buffers while it has a peer); staging
  // gets the rest (AsyncSaveOptions::staging_budget_bytes) and stages in waves that fit.
  // A budget smaller than the largest entry plus the tier's share is refused by
  // prepare(), before the first step, naming the smallest that fits. Until the optimizer's first step its
  // state is taken to be AdamW's: two fp32 tensors of each of this rank's parameters. Not
  // with checkpoints().save_options().staging_budget_bytes().
  TORCH_ARG(int64_t, checkpoint_host_budget_bytes) = 0;
  TORCH_ARG(dist::PreemptionOptions, preemption) = {};
  // The optimizer state swapped to host memory or disk between steps (optim/swap_config.h).
  TORCH_ARG(std::optional<optim::SwapOptimizerConfig>, swap) = std::nullopt;
  // With several ranks: 1 shards the optimizer state, 2 the gradients too.
  TORCH_ARG(int64_t, zero_stage) = 2;
  // With several ranks: the gradients are views of the reducer's buckets (false: a copy).
  TORCH_ARG(bool, gradient_as_bucket_view) = true;
  // With several ranks: rank 0's buffers (BatchNorm's running statistics) are sent to
  // every rank before each forward (DDP's broadcast_buffers), so that the replicas, and
  // the checkpoint that keeps one copy of them, agree.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Released CPU tensors of at least memory::kMinCachedBlockBytes kept for the next step,
  // up to this many bytes in all, while the Trainer lives (memory::ScopedCpuCacheLimit).
  // Without it glibc's malloc gives a step's large temporaries back to the kernel and the
  // next step faults them in again: ~3,000 page faults a step for `stowage train`'s model
  // (docs/benchmarks.md, issue 37). 0: nothing cached.
  TORCH_ARG(int64_t, cpu_cache_bytes) = int64_t(1) << 30;
  // Tokens (or samples) of one step over all ranks, for StepRecord::tokens_per_s; 0: none.
  TORCH_ARG(int64_t, tokens_per_step) = 0;
  // Makes rank 0's event sink, given <run_dir>/metrics.jsonl, once the run directory is
  // claimed; none: a MetricsFile there.
  using EventSinkFactory = std::function<std::shared_ptr<EventSink>(const std::string& metrics_path)>;
  TORCH_ARG(EventSinkFactory, events) = nullptr;
};

// /dev/shm/stowage-<16 hex digits of a hash of run_dir's absolute path>: a run's memory
// tier, the same for every rank and every restart of the run.
std::string default_memory_directory(const std::string& run_dir);

class Trainer {
 public:
  using OptimizerFactory = optim::ZeroRedundancyOptimizer::OptimizerFactory;

  // Checks the options (InvalidArgument naming the option), catches the preemption
  // signals, joins the job (dist::join_world) and picks this rank's device. Creates no
  // file.
  explicit Trainer(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  const dist::World& world() const;
  c10::Device device() const;
  const TrainerOptions& options() const;

  // Makes every rank's parameters rank 0's (with several ranks), the optimizer over
  // `model`'s parameters (this rank's share of them, with the swap if configured), the
  // gradient reducer (it makes every rank's buffers rank 0's), and the training state (model, optimizer, the step
  // and the generators of the data, the CPU and device()); then claims the run directory
  // (run_directory.h: every rank agrees on a refusal) and opens the metrics. Nothing is
  // created in the run directory before every check has passed. A failure on any rank is
  // every rank's (the others throw an Error naming it).
  // REQUIRES: called once; `model` on device(), initialised alike on every rank;
  // `data` a CPU generator, seeded alike on every rank.
  void prepare(std::shared_ptr<torch::nn::Module> model, const OptimizerFactory& make_optimizer, at::Generator data);

  // Restores (resume: the latest committed checkpoint that can be read, reporting each
  // skipped; resume_from: that checkpoint) and returns the first step to train: 1, the
  // step after the one restored, or steps + 1 when nothing is left (done already, or
  // preempted before the first step: finish() then says so). Throws what the restore
  // throws (dcp::CheckpointManager::restore: none of the checkpoints could be read, or the
  // state refused one), the same on every rank.
  // REQUIRES: prepare() was called, restore() was not (InvalidArgument otherwise).
  int64_t restore();

  // Before the forward: resets the gradients and the device's peak statistics.
  // REQUIRES: restore() was called (InvalidArgument otherwise).
  void begin_step();

  // After the backward: averages the gradients over the ranks and brings every rank's
  // buffers to rank 0's (broadcast_buffers), waits for the snapshot of the save in
  // flight, updates, saves if due, reports, and checks for preemption (collective).
  // Returns false when the job is preempted: the step is committed (or the run has no
  // checkpoints), and the loop must stop and call finish(). Throws Error when the save of
  // a preempted step fails, and a failed save as the checkpoints' failure policy says
  // (dcp::CheckpointManager: kStop, or max_consecutive_failures in a row).
  // REQUIRES: begin_step() was called for `step`, the step after the last one
  // (InvalidArgument otherwise).
  bool end_step(int64_t step, double loss);

  // Waits for the save in flight and reports the end of the run. Returns the exit
  // status: 0 done with its last checkpoint committed, 1 the last checkpoint failed,
  // dist::kPreemptedStatus preempted. Again: the same status.
  int finish();

  // The optimizer the Trainer made (its local optimizer's options, e.g. to change lr).
  // REQUIRES: prepare() was called (InvalidArgument otherwise).
  optim::ZeroRedundancyOptimizer& optimizer();
  // Rank 0's event sink (after prepare()); nullptr on the other ranks.
  EventSink* events();
  // The step last trained or restored.
  int64_t step() const;

 private:
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

}  // namespace stowage::train
