// `stowage train`: trains the byte-level transformer LM of train_model.h on a text
// corpus through a train::Trainer, which owns the training protocol (ranks, ZeRO, swap,
// checkpoints, resume, failure policy, preemption; include/stowage/train/trainer.h).
// This file keeps the model's loop and the mapping of flags to options. Every flag is
// checked before anything is created or any rank is started, under its own name.
// Exit statuses: 0 done, its last checkpoint committed; 1 an error, or the last
// checkpoint failed; 2 bad arguments; dist::kPreemptedStatus (75) preempted, the step
// it ended on committed; 128 + N killed by signal N.
#include "cli_numbers.h"
#include "commands.h"
#include "train_data.h"
#include "train_model.h"
#include "train_options.h"
#include "train_progress.h"
#include "train_setup.h"

#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/train/trainer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;

train::TrainerOptions trainer_options(const TrainOptions& options, c10::Device device) {
  std::vector<int> signals;
  for (const std::string& name : options.preempt_signals) signals.push_back(*parse_signal(name));  // validated
  std::optional<optim::SwapOptimizerConfig> swap;
  if (options.swap_times > 0) {
    swap = optim::SwapOptimizerConfig().swap_times(options.swap_times);
    if (!swap_dir(options).empty()) swap->swap_dir(swap_dir(options));
    if (!options.swap_host_budget.empty()) swap->host_budget_bytes(*parse_byte_size(options.swap_host_budget));
  }
  const auto on_failure =
      options.on_save_failure == "stop" ? dcp::SaveFailurePolicy::kStop : dcp::SaveFailurePolicy::kContinue;
  return train::TrainerOptions(options.run_dir)
      .steps(options.steps)
      .device(device)
      .resume(options.resume)
      .resume_from(options.resume_from)
      .open_checkpoint([](const std::string& path) { return dcp::open_checkpoint(path); })
      .config(run_config(options))
      .allow_config_change(options.allow_config_change)
      .checkpoints(dcp::CheckpointManagerOptions()
                       .save_every(options.ckpt_every)
                       .keep_last(options.keep)
                       .on_save_failure(on_failure)
                       .max_consecutive_failures(options.max_save_failures))
      .preemption(dist::PreemptionOptions().signals(signals).grace(*parse_duration(options.preempt_grace)))
      .swap(swap)
      .zero_stage(options.zero_stage)
      .gradient_as_bucket_view(options.gradient_as_bucket_view)
      .tokens_per_step(options.batch * options.seq_len)
      .cpu_cache_bytes(*parse_byte_size_or_zero(options.cpu_cache))  // the option's validator parsed it
      .events([log_every = options.log_every](const std::string& metrics_path) {
        return std::make_shared<Progress>(metrics_path, isatty(STDOUT_FILENO) != 0, log_every);
      });
}

int train(const TrainOptions& options) {
  torch::set_num_threads(options.threads);
  // "cuda" alone is each rank's cuda:LOCAL_RANK: that is the one to check.
  const c10::Device device =
      parse_device(options.device == "cuda" ? dist::rank_device(c10::Device(c10::kCUDA)).str() : options.device);
  train::Trainer trainer(trainer_options(options, device));
  const Corpus corpus = Corpus::load(options.corpus, options.seq_len + 2);
  LanguageModel model = make_model(options);
  model->to(trainer.device());  // initialised on the CPU, so that every device starts from the same weights
  const std::string recompute =
      configure_activation_checkpointing(model, options, corpus, trainer.device(), trainer.world().size);
  const double lr = options.lr;
  auto data = at::make_generator<at::CPUGeneratorImpl>(options.seed + 1);  // the global batch, on every rank
  trainer.prepare(
      model.ptr(),
      [lr](std::vector<torch::Tensor> share) {
        return std::make_shared<torch::optim::AdamW>(std::move(share), torch::optim::AdamWOptions(lr));
      },
      data);
  if (trainer.events()) trainer.events()->message(describe_run(options, model, corpus, recompute, trainer));
  const int64_t slice = options.batch / trainer.world().size;
  for (int64_t step = trainer.restore(); step <= options.steps; ++step) {
    auto [inputs, targets] = corpus.sample(options.batch, options.seq_len, data);
    inputs = inputs.narrow(0, trainer.world().rank * slice, slice).to(trainer.device());
    targets = targets.narrow(0, trainer.world().rank * slice, slice).to(trainer.device());
    trainer.begin_step();
    auto logits = model->forward(inputs, [&](auto& blocks, const auto& x) { return run_blocks(options, blocks, x); });
    auto loss = torch::cross_entropy_loss(logits.view({-1, 256}), targets.reshape({-1}));
    loss.backward();
    if (!trainer.end_step(step, loss.item<double>())) break;
  }
  return trainer.finish();
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand("train", "Train a byte-level transformer language model on a text corpus");
  cmd->add_option("--corpus", options->corpus, "text file or directory of text files")->capture_default_str();
  cmd->add_option("--run-dir", options->run_dir, "where metrics and checkpoints go")->capture_default_str();
  cmd->add_option("--steps", options->steps, "train until this step")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--batch", options->batch, "sequences per step")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--seq-len", options->seq_len, "tokens per sequence")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--layers", options->layers, "transformer blocks")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--width", options->width, "model width")->check(positive_integer<int64_t>())->capture_default_str();
  cmd->add_option("--heads", options->heads, "attention heads")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--lr", options->lr, "AdamW learning rate")->check(positive_number())->capture_default_str();
  cmd->add_option("--seed", options->seed, "random seed")
      ->check(non_negative_integer<uint64_t>())
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "intra-op threads")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--recompute-segments", options->recompute_segments,
                  "activation checkpointing: checkpoint_sequential segments over the blocks (0: off)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--selective-recompute", options->selective_recompute,
                  "activation checkpointing of one part of each block only: its attention core (scores, softmax, "
                  "weighted values) or its MLP; with --recompute-segments 0")
      ->check(CLI::IsMember({"attention-core", "mlp"}));
  cmd->add_flag("--offload-checkpoint-inputs", options->offload_checkpoint_inputs,
                "activation checkpointing: keep the inputs of the checkpoints in pinned host memory until backward "
                "(on a device; nothing on the CPU)");
  cmd->add_option("--activation-budget", options->activation_budget,
                  "activation checkpointing picked for a budget: which blocks run plainly, with their attention "
                  "core and MLP recomputed, recomputed whole, or with their inputs offloaded, so that a step's "
                  "activation peak fits SIZE (e.g. 24MiB) with the least recomputation")
      ->check(byte_size());
  cmd->add_option("--swap-times", options->swap_times,
                  "optimizer-state swap batches (0: plain AdamW with its state resident)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--swap-to", options->swap_to,
                  "where swapped optimizer states live between steps: host, or disk:DIR (scratch files in DIR, "
                  "read and written one batch ahead)")
      ->capture_default_str();
  cmd->add_option("--swap-host-budget", options->swap_host_budget,
                  "with --swap-to disk:DIR: host memory for the disk tier's buffers, e.g. 256MiB (default: four "
                  "buffers of one batch)")
      ->check(byte_size());
  cmd->add_option("--ckpt-every", options->ckpt_every, "asynchronous checkpoint every K steps (0: none)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--keep", options->keep, "committed checkpoints to keep")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  auto* resume =
      cmd->add_flag("--resume", options->resume, "continue from the run directory's latest committed checkpoint");
  cmd->add_option("--resume-from", options->resume_from,
                  "start from another checkpoint: one stowage train wrote gives model, optimizer and step; any "
                  "other (stowage's or PyTorch DCP's) the model's weights, with a fresh optimizer at step 0")
      ->excludes(resume);
  cmd->add_option("--cpu-cache", options->cpu_cache,
                  "released CPU tensors of 128 KiB or more kept for the next step, up to this size in all (0: none; "
                  "without it, each step faults its large temporaries in again)")
      ->check(byte_size_or_zero())
      ->capture_default_str();
  cmd->add_option("--log-every", options->log_every, "steps between log lines when not on a terminal")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--nproc", options->nproc,
                  "data-parallel ranks on this machine, started as with `stowage launch`; --batch is split "
                  "over them and the optimizer state sharded")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--zero-stage", options->zero_stage,
                  "with several ranks: 1 shards the optimizer state over them, 2 the gradients too (each rank "
                  "keeps only those of its own parameters); stage 3 (parameters) is not supported")
      ->check(integer_in<int64_t>(1, 2))
      ->capture_default_str();
  cmd->add_option("--gradient-as-bucket-view", options->gradient_as_bucket_view,
                  "with several ranks: the gradients are views of the reducer's buckets (true), or the buckets a "
                  "second copy of them (false: more memory and copies, as PyTorch DDP's default)")
      ->capture_default_str();
  cmd->add_option(
         "--device", options->device,
         "where the model trains: cpu, sim or sim:N (the simulated device, with LibTorch 2.x), cuda:N, or cuda "
         "(each rank on cuda:LOCAL_RANK)")
      ->capture_default_str();
  cmd->add_option("--on-save-failure", options->on_save_failure,
                  "a failed checkpoint: continue (reported on stderr and in metrics.jsonl; the run exits 1 at the "
                  "end if its last checkpoint failed) or stop")
      ->check(CLI::IsMember({"continue", "stop"}))
      ->capture_default_str();
  cmd->add_option("--max-save-failures", options->max_save_failures,
                  "with --on-save-failure continue: this many failed checkpoints in a row stop the run (0: never)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--preempt-signal", options->preempt_signals,
                  "signals that preempt the run: it finishes the step, saves it and exits with status 75; a "
                  "second one exits at once (repeat the flag for several: TERM, USR1, ...)")
      ->check(signal_name())
      ->capture_default_str();
  cmd->add_option("--preempt-grace", options->preempt_grace,
                  "after a preempting signal, exit this long later even if the checkpoint is not committed "
                  "(e.g. 30s; 0: no deadline)")
      ->check(duration())
      ->capture_default_str();
  cmd->add_flag("--allow-config-change", options->allow_config_change,
                "--resume a run with another --corpus, --batch, --seq-len, --layers, --width, --heads or --seed "
                "than it was started with (refused otherwise)");
  cmd->callback([options, cmd] {
    // The budget picks the plan: it sets aside the default segments, not ones the user gave.
    if (!options->activation_budget.empty() && cmd->count("--recompute-segments") == 0) {
      options->recompute_segments = 0;
    }
    const char* world_size = std::getenv("WORLD_SIZE");
    try {  // bad arguments: status 2, as the parser's
      check_train_options(*options, world_size != nullptr ? std::max(1, std::atoi(world_size)) : options->nproc);
      check_run(*options);
    } catch (const InvalidArgument& e) {
      throw CLI::ValidationError(e.what());
    }
    if (options->nproc > 1 && world_size == nullptr) {
      const int code = launch_ranks(options->nproc, /*port=*/0, std::chrono::seconds(5), own_command_line());
      if (code != 0) throw CLI::RuntimeError(code);
      return;
    }
    if (world_size != nullptr && options->nproc > 1 && options->nproc != std::atoi(world_size)) {
      throw InvalidArgument(fmt::format("--nproc {} but WORLD_SIZE is {}", options->nproc, world_size));
    }
    if (const int status = train(*options); status != 0) throw CLI::RuntimeError(status);
  });
}

}  // namespace stowage::cli
