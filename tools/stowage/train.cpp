// `stowage train`: trains the byte-level transformer LM of train_model.h on a text
// corpus through a train::Trainer, which owns the training protocol (ranks, ZeRO, swap,
// checkpoints, resume, failure policy, preemption; include/stowage/train/trainer.h).
// This file keeps the model's loop and the mapping of flags to options. Every flag is
// checked before anything is created or any rank is started, under its own name.
// Exit statuses: 0 done, its last checkpoint committed; 1 an error, or the last
// checkpoint failed; 2 bad arguments; kOutOfMemoryStatus (3) a device ran out of memory
// (cli/program.h); dist::kPreemptedStatus (75) preempted, the step it ended on committed;
// 128 + N killed by signal N.
#include "cli_numbers.h"
#include "commands.h"
#include "device_option.h"
#include "launch_ranks.h"
#include "train_checks.h"
#include "train_data.h"
#include "train_model.h"
#include "train_progress.h"
#include "train_setup.h"

#include <stowage/error.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/train/trainer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;

// `progress`: rank 0's events, once the Trainer's prepare() made them.
train::TrainerOptions trainer_options(const TrainOptions& options, c10::Device device,
                                      std::shared_ptr<Progress>& progress) {
  std::vector<int> signals;
  for (const std::string& name : options.preempt_signals) signals.push_back(*parse_signal(name));  // validated
  std::optional<optim::SwapOptimizerConfig> swap;
  if (options.swap_times > 0 || options.optimizer_update == "host") swap = swap_config(options);
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
      .memory_checkpoints(dcp::MemoryTierOptions(options.memory_ckpt_dir).save_every(options.memory_ckpt_every))
      .checkpoint_host_budget_bytes(options.ckpt_host_budget.empty() ? 0 : *parse_byte_size(options.ckpt_host_budget))
      .preemption(dist::PreemptionOptions().signals(signals).grace(*parse_duration(options.preempt_grace)))
      .swap(swap)
      .zero_stage(options.zero_stage)
      .gradient_as_bucket_view(options.gradient_as_bucket_view)
      .tokens_per_step(options.batch * options.seq_len)
      .cpu_cache_bytes(*parse_byte_size_or_zero(options.cpu_cache))  // the option's validator parsed it
      .events([&progress, log_every = options.log_every](const std::string& metrics_path) {
        progress = std::make_shared<Progress>(metrics_path, isatty(STDOUT_FILENO) != 0, log_every);
        return progress;
      });
}

// metrics.jsonl's "setup" record: what the flags picked, for a program that reads the run
// (the benchmarks).
void record_setup(Progress& progress, LanguageModel& model, const ActivationCheckpointing& recompute) {
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  progress.record(nlohmann::json{{"event", "setup"},
                                 {"parameters", parameters},
                                 {"activation_checkpointing", recompute.picked},
                                 {"activation_budget_bytes", recompute.budget_bytes},
                                 {"activation_measured_peak_bytes", recompute.measured_peak_bytes}}
                      .dump());
}

int train(const TrainOptions& options) {
  torch::set_num_threads(options.threads);
  // "cuda" alone is each rank's cuda:LOCAL_RANK: that is the one to check.
  const c10::Device device =
      parse_device(options.device == "cuda" ? dist::rank_device(c10::Device(c10::kCUDA)).str() : options.device);
  std::shared_ptr<Progress> progress;
  train::Trainer trainer(trainer_options(options, device, progress));
  const Corpus corpus = Corpus::load(options.corpus, options.seq_len + 2);
  LanguageModel model = make_model(options);
  model->to(trainer.device());  // initialised on the CPU, so that every device starts from the same weights
  const ActivationCheckpointing recompute =
      configure_activation_checkpointing(model, options, corpus, trainer.device(), trainer.world().size);
  const double lr = options.lr;
  auto data = at::make_generator<at::CPUGeneratorImpl>(options.seed + 1);  // the global batch, on every rank
  trainer.prepare(
      model.ptr(),
      [lr](std::vector<torch::Tensor> share) {
        return std::make_shared<torch::optim::AdamW>(std::move(share), torch::optim::AdamWOptions(lr));
      },
      data);
  if (progress) {
    record_setup(*progress, model, recompute);
    progress->message(describe_run(options, model, corpus, recompute, trainer));
  }
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
  add_train_options(*cmd, *options);
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
      const int code = launch_ranks(options->nproc, /*port=*/0, std::chrono::seconds(5), own_command_line(),
                                    options->nproc_per_node);
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
