// `stowage train`: trains the byte-level transformer LM of train_model.h on a text
// corpus with the three capabilities of stowage, each on by default and switchable:
// activation checkpointing of the transformer blocks, optimizer-state swap of AdamW,
// and asynchronous checkpoints every K steps from which --resume continues exactly.
// With --nproc N (or under torchrun) it trains data-parallel on N ranks with the
// optimizer state sharded over them (optim::ZeroRedundancyOptimizer) and the gradients
// averaged during backward (dist::GradientReducer): each to its owner alone with
// --zero-stage 2 (the default), to every rank with --zero-stage 1.
//
// A failed checkpoint does not end the run (--on-save-failure), and SIGTERM (or
// --preempt-signal) makes it save the step it is on and exit. Exit statuses: 0 trained
// to --steps with the last checkpoint committed; 1 an error, or the last checkpoint
// failed; kPreemptedStatus preempted, with the step it ended on committed; 128 + N
// killed by signal N: a second notice signal, or the --preempt-grace deadline.
#include "cli_numbers.h"
#include "commands.h"
#include "train_data.h"
#include "train_model.h"
#include "train_options.h"
#include "train_progress.h"

#include <stowage/stowage.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <vector>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

dcp::CheckpointManagerOptions checkpoint_options(const TrainOptions& options) {
  return dcp::CheckpointManagerOptions()
      .save_every(options.ckpt_every)
      .keep_last(options.keep)
      .on_save_failure(options.on_save_failure == "stop" ? dcp::SaveFailurePolicy::kStop
                                                         : dcp::SaveFailurePolicy::kContinue)
      .max_consecutive_failures(options.max_save_failures);
}

dist::PreemptionOptions preemption_options(const TrainOptions& options) {
  std::vector<int> signals;
  for (const std::string& name : options.preempt_signals) signals.push_back(*parse_signal(name));  // validated
  return dist::PreemptionOptions().signals(signals).grace(*parse_duration(options.preempt_grace));
}

// "SIGTERM".
std::string signal_name_of(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation != nullptr ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal);
}

// The swap optimizer's options from --swap-times, --swap-to and --swap-host-budget.
optim::SwapOptimizerConfig swap_config(const TrainOptions& options) {
  auto config = optim::SwapOptimizerConfig().swap_times(options.swap_times);
  const std::string disk_prefix = "disk:";
  if (options.swap_to.rfind(disk_prefix, 0) == 0 && options.swap_to.size() > disk_prefix.size()) {
    config.swap_dir(options.swap_to.substr(disk_prefix.size()));
  } else if (options.swap_to != "host") {
    throw InvalidArgument(fmt::format(
        "--swap-to '{}': expected 'host' or 'disk:DIR' (a directory for the scratch files)", options.swap_to));
  }
  if (!options.swap_host_budget.empty()) {
    if (!config.disk_tier()) {
      throw InvalidArgument(
          fmt::format("--swap-host-budget {} bounds the disk tier's buffers: it needs --swap-to disk:DIR",
                      options.swap_host_budget));
    }
    config.host_budget_bytes(*parse_byte_size(options.swap_host_budget));  // the option's validator parsed it
  }
  return config;
}

// The ranks of the run, as torchrun and `stowage launch` set them (dist::join_world),
// checked against --nproc and --batch.
dist::World join_world(const TrainOptions& options) {
  // --nproc N > 1 without WORLD_SIZE started N ranks instead of training (add_train_command).
  dist::World world = dist::join_world();
  if (options.nproc > 1 && options.nproc != world.size) {
    throw InvalidArgument(fmt::format("--nproc {} but WORLD_SIZE is {}", options.nproc, world.size));
  }
  if (options.batch % world.size != 0) {
    throw InvalidArgument(
        fmt::format("--batch {} (the global batch) does not split evenly over {} ranks", options.batch, world.size));
  }
  return world;
}

// This process's command line, with the absolute path of its executable, to start the
// ranks of --nproc with.
std::vector<std::string> own_command_line() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(file, arg, '\0');) args.push_back(arg);
  if (args.empty()) throw Error("train --nproc: cannot read /proc/self/cmdline");
  args[0] = executable_path();
  return args;
}

double mean_over_ranks(const dist::ProcessGroup& group, double value) {
  at::Tensor buffer = at::full({1}, value, at::kDouble);
  group.all_reduce_sum(buffer);
  return buffer.item<double>() / static_cast<double>(group.size());
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The bytes of the storages behind `tensors`, each counted once: a gradient that is a
// view of the GradientReducer's bucket counts the bucket.
int64_t storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

// The device of --device for this rank: "cuda" alone means cuda:LOCAL_RANK (torchrun's
// local rank, dist::rank_device), one GPU per rank; anything else as parse_device reads it.
c10::Device rank_device(const std::string& text) {
  if (text == "cuda") return parse_device(dist::rank_device(c10::Device(c10::kCUDA)).str());
  return parse_device(text);
}

class Trainer {
 public:
  explicit Trainer(TrainOptions options)
      : options_(std::move(options)),
        notice_(preemption_options(options_)),
        world_(join_world(options_)),
        device_(rank_device(options_.device)) {}

  void run() {
    dist::PreemptionNotice& notice = notice_;
    torch::set_num_threads(options_.threads);
    memory::enable_accounting();
    // The options are checked (the corpus read, the model built) before anything is
    // created in the run directory, so that a bad one leaves nothing behind.
    const Corpus corpus = Corpus::load(options_.corpus, options_.seq_len + 2);
    build(corpus);
    fs::create_directories(options_.run_dir);
    // Rank 0 reports for the run; the other ranks only train.
    std::optional<Progress> progress;
    if (world_.rank == 0) {
      progress.emplace((fs::path(options_.run_dir) / "metrics.jsonl").string(), isatty(STDOUT_FILENO) != 0,
                       options_.log_every);
      progress_ = &*progress;
      progress_->message(describe(corpus));
    }
    // One training run per run directory: the manager removes what uncommitted saves left.
    checkpoints_.emplace(checkpoints_dir(options_.run_dir), checkpoint_options(options_), world_.group);
    if (options_.resume) resume();
    if (!options_.resume_from.empty()) resume_from(options_.resume_from);
    if (notice.agreed(world_.group)) preempt(notice, /*trained=*/false);

    double first_loss = -1, last_loss = 0;
    const auto run_start = Clock::now();
    last_step_end_ = run_start;
    const int64_t first_step = current_step() + 1;
    for (int64_t step = first_step; step <= options_.steps; ++step) {
      last_loss = train_step(corpus, step);
      if (first_loss < 0) first_loss = last_loss;
      // The last step is saved too, so that a resumed run continues from where this one ended.
      const bool last_step = options_.ckpt_every > 0 && step == options_.steps;
      if (checkpoints_->should_save(step) || last_step) checkpoints_->save(step, live_state(), /*force=*/last_step);
      if (notice.agreed(world_.group)) preempt(notice, /*trained=*/true);
    }
    report_checkpoints(checkpoints_->wait());
    if (progress_ && first_step <= options_.steps) {
      progress_->message(
          fmt::format("done: steps {}-{} in {:.3f} s, loss {:.3f} -> {:.3f}, peak activations {}, "
                      "between steps: optimizer state {}, gradients {}; at peak: {} beyond the parameters",
                      first_step, options_.steps, seconds_since(run_start), first_loss, last_loss,
                      format_bytes(peak_activation_bytes_), format_bytes(resident_bytes_),
                      format_bytes(gradient_bytes_), format_bytes(peak_step_bytes_)));
    } else if (progress_) {
      progress_->message(fmt::format("nothing to do: the run is already at step {}", current_step()));
    }
    progress_ = nullptr;
    if (last_save_error_) {
      throw Error(
          fmt::format("the last checkpoint (step {}) failed: {}", last_save_error_->first, last_save_error_->second));
    }
  }

 private:
  // Ends a preempted run: saves the step it is on (unless --ckpt-every 0, or no step
  // was trained since the checkpoint it resumed from), then exits with kPreemptedStatus.
  // Every rank gets here at the same step (PreemptionNotice::agreed).
  [[noreturn]] void preempt(dist::PreemptionNotice& notice, bool trained) {
    const std::string signal = signal_name_of(notice.signal_number());
    const auto start = Clock::now();
    std::string saved = "nothing to save: no step was trained";
    if (trained && options_.ckpt_every == 0) {
      saved = "no checkpoint: --ckpt-every 0";
    } else if (trained) {
      if (progress_) progress_->message(fmt::format("{}: saving step {} before exiting", signal, current_step()));
      report_checkpoints(checkpoints_->save_now(current_step(), live_state()));
      if (last_save_error_) {
        throw Error(fmt::format("{}: the checkpoint of step {} failed, the run ends without it: {}", signal,
                                current_step(), last_save_error_->second));
      }
      saved = fmt::format("step {} committed in {:.3f} s", current_step(), seconds_since(start));
    }
    // No rank exits before every rank is past the commit. Disarmed only then, so that a
    // second signal or the grace deadline still ends a rank that waits for a dead one.
    if (world_.group) world_.group->barrier();
    notice.disarm();  // the job ends on its own terms now: a signal still to come is ignored
    if (progress_) {
      progress_->message(fmt::format("preempted by {} at step {}: {}; exiting with status {} (--resume continues)",
                                     signal, current_step(), saved, kPreemptedStatus));
    }
    throw CLI::RuntimeError(kPreemptedStatus);
  }

  void build(const Corpus& corpus) {
    torch::manual_seed(options_.seed);
    LanguageModelOptions model_options;
    model_options.context = options_.seq_len;
    model_options.layers = options_.layers;
    model_options.width = options_.width;
    model_options.heads = options_.heads;
    model_ = LanguageModel(model_options);
    // Initialised on the CPU and then moved, so that every device starts from the same weights.
    model_->to(device_);
    vocab_ = model_options.vocab;
    if (options_.recompute_segments > options_.layers) {
      throw InvalidArgument(fmt::format("--recompute-segments {} exceeds the {} transformer blocks",
                                        options_.recompute_segments, options_.layers));
    }
    if (options_.offload_checkpoint_inputs && options_.recompute_segments == 0 &&
        options_.selective_recompute.empty()) {
      throw InvalidArgument(
          "--offload-checkpoint-inputs offloads the inputs of activation checkpoints, but none are made: pass "
          "--recompute-segments N or --selective-recompute with it");
    }
    if (!options_.activation_budget.empty()) {
      const std::string chosen = options_.recompute_segments > 0         ? "--recompute-segments"
                                 : !options_.selective_recompute.empty() ? "--selective-recompute"
                                 : options_.offload_checkpoint_inputs    ? "--offload-checkpoint-inputs"
                                                                         : "";
      if (!chosen.empty()) {
        throw InvalidArgument(fmt::format(
            "--activation-budget {} picks what to recompute and offload itself, and {} chooses it too; pass "
            "--recompute-segments 0 and no other activation checkpointing with --activation-budget",
            options_.activation_budget, chosen));
      }
    }
    if (!options_.selective_recompute.empty()) {
      if (options_.recompute_segments > 0) {
        throw InvalidArgument(fmt::format(
            "--selective-recompute {} checkpoints part of each block and --recompute-segments {} whole blocks; "
            "pass --recompute-segments 0 with --selective-recompute",
            options_.selective_recompute, options_.recompute_segments));
      }
      const std::string site = options_.selective_recompute == "mlp" ? "mlp" : "attention_core";
      activation::apply_activation_checkpointing(
          *model_, activation::module_name(R"(blocks\.\d+\.)" + site),
          activation::CheckpointOptions().offload_inputs(options_.offload_checkpoint_inputs));
    }
    if (!options_.activation_budget.empty()) fit_activation_budget(corpus);
    baseline_bytes_ = memory::memory_allocated(device_);
    // Each rank's optimizer steps its own share of the parameters: all of them on one rank.
    const std::vector<torch::Tensor> params = model_->parameters();
    optim::ZeroRedundancyOptimizerOptions zero_options;
    if (options_.swap_times > 0) zero_options.swap(swap_config(options_));
    const double lr = options_.lr;
    optimizer_ = c10::make_intrusive<optim::ZeroRedundancyOptimizer>(
        params,
        [lr](std::vector<torch::Tensor> share) {
          return std::make_shared<torch::optim::AdamW>(std::move(share), torch::optim::AdamWOptions(lr));
        },
        world_.group, zero_options);
    if (world_.group) {
      auto reducer_options = dist::GradientReducerOptions().gradient_as_bucket_view(options_.gradient_as_bucket_view);
      if (options_.zero_stage == 2) reducer_options.gradient_owners(optimizer_->owners());
      gradient_reducer_ = std::make_unique<dist::GradientReducer>(params, *world_.group, reducer_options);
    }
    // One data stream for the run: every rank draws the global batch and takes its slice.
    data_generator_ = at::make_generator<at::CPUGeneratorImpl>(options_.seed + 1);
    training_progress_ = c10::make_intrusive<TrainingProgress>(data_generator_);
  }

  // Picks which blocks to checkpoint for --activation-budget, from forward and backward
  // passes on a batch of this rank's size drawn apart from the training data (whose stream
  // stays as without a budget). Before the gradient reducer exists: its hooks would make
  // collectives of passes whose number each rank decides alone.
  void fit_activation_budget(const Corpus& corpus) {
    const int64_t budget = *parse_byte_size(options_.activation_budget);  // the option's validator parsed it
    auto generator = at::make_generator<at::CPUGeneratorImpl>(options_.seed + 2);
    const auto batch = corpus.sample(options_.batch / world_.size, options_.seq_len, generator);
    const torch::Tensor tokens = batch.first.to(device_);
    const torch::Tensor targets = batch.second.to(device_);
    torch::Tensor block_input;
    {
      torch::NoGradGuard no_grad;
      model_->forward(tokens, [&](torch::nn::Sequential& blocks, const torch::Tensor& x) {
        block_input = x;
        return blocks->forward(x);
      });
    }
    // As train_step() measures it, at its first step: the gradients are made in backward.
    const auto step_peak = [&] {
      for (auto& p : model_->parameters()) p.mutable_grad().reset();
      memory::reset_peak_memory_stats(device_);
      const int64_t before = memory::memory_allocated(device_);
      auto logits = model_->forward(tokens);
      torch::cross_entropy_loss(logits.view({-1, vocab_}), targets.reshape({-1})).backward();
      return memory::max_memory_allocated(device_) - before;
    };
    const activation::FittedPlan fitted =
        activation::fit_activation_budget(model_->blocks(), block_input, budget, step_peak);
    for (auto& p : model_->parameters()) p.mutable_grad().reset();
    budget_plan_ = fmt::format("{} for a budget of {} (a step measured {})", fitted.plan.describe(),
                               format_bytes(budget), format_bytes(fitted.measured_peak_bytes));
  }

  // "2 segments", "selective (mlp)", the budget's plan or "off".
  std::string activation_checkpointing() const {
    if (!budget_plan_.empty()) return budget_plan_;
    const char* offload = options_.offload_checkpoint_inputs ? ", inputs offloaded" : "";
    if (options_.recompute_segments > 0) return fmt::format("{} segments{}", options_.recompute_segments, offload);
    if (!options_.selective_recompute.empty()) {
      return fmt::format("selective ({}){}", options_.selective_recompute, offload);
    }
    return "off";
  }

  // "host", or "disk:DIR via io_uring".
  std::string swap_destination() const {
    if (!optimizer_->swap()->config().disk_tier()) return options_.swap_to;
    return fmt::format("{} via {}", options_.swap_to, optim::io_path_name(optimizer_->swap()->disk_stats().io_path));
  }

  std::string describe(const Corpus& corpus) const {
    int64_t parameters = 0;
    for (const auto& p : model_->parameters()) parameters += p.numel();
    return fmt::format(
        "training a {}-layer byte-level transformer ({:.2f}M parameters) on '{}' ({} bytes); activation "
        "checkpointing: {}; optimizer: {}; checkpoints: {}{}{}",
        options_.layers, parameters / 1e6, corpus.source(), corpus.size(), activation_checkpointing(),
        optimizer_->swap()
            ? fmt::format("AdamW with state swap ({} batches, to {})", options_.swap_times, options_.swap_to)
            : "plain AdamW",
        options_.ckpt_every > 0 ? fmt::format("every {} steps into {}, keeping {}", options_.ckpt_every,
                                              checkpoints_dir(options_.run_dir), options_.keep)
                                : "off",
        world_.size > 1
            ? fmt::format("; data-parallel over {} ranks, ZeRO stage {}: optimizer state{} sharded "
                          "(rank 0 owns parameters {}-{} of {})",
                          world_.size, options_.zero_stage, options_.zero_stage == 2 ? " and gradients" : "",
                          optimizer_->owned().begin, optimizer_->owned().end - 1, model_->parameters().size())
            : "",
        device_.is_cpu() ? ""
                         : fmt::format("; on {}{}", device_.str(),
                                       world_.group ? fmt::format(", gradients reduced through c10d {}",
                                                                  world_.group->backend_name(device_))
                                                    : ""));
  }

  double train_step(const Corpus& corpus, int64_t step) {
    auto [inputs, targets] = corpus.sample(options_.batch, options_.seq_len, data_generator_);
    if (world_.size > 1) {
      const int64_t slice = options_.batch / world_.size;
      inputs = inputs.narrow(0, world_.rank * slice, slice);
      targets = targets.narrow(0, world_.rank * slice, slice);
    }
    inputs = inputs.to(device_);
    targets = targets.to(device_);
    if (gradient_reducer_) {
      gradient_reducer_->zero_grad();  // in place: the gradients are views of its buckets
    } else {
      model_->zero_grad();
    }
    memory::reset_peak_memory_stats(device_);
    const int64_t before = memory::memory_allocated(device_);
    double loss_value = 0;
    {
      const int64_t segments = options_.recompute_segments;
      const auto checkpoint_options =
          activation::CheckpointOptions().offload_inputs(options_.offload_checkpoint_inputs);
      auto logits = model_->forward(inputs, [&](torch::nn::Sequential& blocks, const torch::Tensor& x) {
        return segments > 0 ? activation::checkpoint_sequential(blocks, segments, x, checkpoint_options)
                            : blocks->forward(x);
      });
      auto loss = torch::cross_entropy_loss(logits.view({-1, vocab_}), targets.reshape({-1}));
      loss.backward();
      loss_value = loss.item<double>();
    }
    if (world_.group) {
      gradient_reducer_->synchronize();
      loss_value = mean_over_ranks(*world_.group, loss_value);
    }
    const int64_t activation_peak = memory::max_memory_allocated(device_) - before;
    // The snapshot of the last checkpoint must be complete before the step changes
    // what it copies; staging overlapped with this step's forward and backward.
    checkpoints_->wait_for_staging();
    optimizer_->step();
    training_progress_->set_step(step);
    // From the end of the step before: what the save after that step blocked counts.
    const auto end = Clock::now();
    const double step_s = std::chrono::duration<double>(end - last_step_end_).count();
    last_step_end_ = end;
    // With copies (--gradient-as-bucket-view false), the reducer's buckets hold gradients too.
    gradient_bytes_ =
        storage_bytes(grads()) +
        (gradient_reducer_ && !options_.gradient_as_bucket_view ? gradient_reducer_->kept_bucket_bytes() : 0);
    resident_bytes_ = memory::memory_allocated(device_) - baseline_bytes_ - gradient_bytes_;
    const int64_t step_peak = memory::max_memory_allocated(device_) - baseline_bytes_;
    peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_peak);
    peak_step_bytes_ = std::max(peak_step_bytes_, step_peak);
    report_checkpoints(checkpoints_->poll());
    if (!progress_) return loss_value;

    StepReport report;
    report.step = step;
    report.total_steps = options_.steps;
    report.loss = loss_value;
    report.step_s = step_s;
    report.tokens_per_s = static_cast<double>(options_.batch * options_.seq_len) / step_s;
    report.peak_activation_bytes = activation_peak;
    report.peak_step_bytes = step_peak;
    report.optimizer_resident_bytes = resident_bytes_;
    report.gradient_bytes = gradient_bytes_;
    const memory::HostBufferStats host = memory::host_buffer_stats();
    report.checkpoint_host_bytes = host.checkpoint_bytes;
    report.optimizer_host_bytes = host.optimizer_bytes;
    progress_->step(report);
    return loss_value;
  }

  std::vector<torch::Tensor> grads() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model_->parameters()) out.push_back(p.grad());
    return out;
  }

  // Everything a resumed run needs: model, optimizer (swapped state included), and the
  // progress (the step, the RNG states and with them the data position). All three are
  // Stateful values, turned into state dicts by dcp on this thread, and loaded back into
  // the live objects. Across ranks, the optimizer states are each rank's own and
  // everything else is replicated (written once).
  StateDict live_state() {
    StateDict state;
    state.insert("model", as_ivalue(model_.ptr()));
    state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(optimizer_)));
    state.insert("progress", as_ivalue(training_progress_));
    return state;
  }

  void report_checkpoints(const std::vector<dcp::SaveReport>& saves) {
    for (const dcp::SaveReport& save : saves) {
      // Every rank sees the same outcome of each save: every rank ends with the same status.
      last_save_error_.reset();
      if (!save.committed) last_save_error_.emplace(save.step, save.error);
      if (!progress_) continue;  // rank 0 reports for the run
      CheckpointReport report;
      report.step = save.step;
      report.committed = save.committed;
      report.error = save.error;
      report.path = save.path;
      report.bytes = save.bytes;
      report.staged_ms = save.blocked_s * 1e3;
      report.committed_gbps = static_cast<double>(save.bytes) / save.commit_s / 1e9;
      progress_->checkpoint(report);
    }
  }

  void resume() {
    // The optimizer loads only this rank's parameters' states, whatever the number of
    // ranks that saved them. A committed checkpoint that cannot be read (corrupt,
    // truncated) is skipped for the next older one; rank 0 says which were skipped and
    // which one the run resumed from.
    StateDict state = live_state();
    std::vector<dcp::SkippedCheckpoint> skipped;
    std::optional<int64_t> step;
    try {
      step = checkpoints_->restore(state, {}, &skipped);
    } catch (...) {
      report_skipped(skipped);  // none could be read: the error says so
      throw;
    }
    report_skipped(skipped);
    if (!step) {
      if (progress_) {
        progress_->message(
            fmt::format("resume: no committed checkpoint in {}: starting from step 0", checkpoints_->directory()));
      }
      return;
    }
    if (progress_) {
      progress_->message(
          fmt::format("resume: from {} (step {})", checkpoints_->checkpoint_path(*step), current_step()));
    }
  }

  void report_skipped(const std::vector<dcp::SkippedCheckpoint>& skipped) {
    if (!progress_) return;  // rank 0 reports for the run
    for (const dcp::SkippedCheckpoint& checkpoint : skipped) {
      progress_->message(fmt::format("resume: skipped {}: {}", checkpoint.path, checkpoint.error));
    }
  }

  // Starts from a checkpoint of another run, stowage's or PyTorch DCP's. One that
  // `stowage train` wrote (it holds the progress entries) gives everything live_state()
  // holds, checked strictly as --resume does; any other gives the model's weights alone,
  // with a fresh optimizer at step 0 (a PyTorch optimizer's state is not this one's).
  void resume_from(const std::string& path) {
    const std::unique_ptr<dcp::StorageReader> reader = dcp::open_checkpoint(path);
    dcp::Metadata metadata = reader->read_metadata();
    metadata.index();
    const bool from_stowage_train = metadata.find("progress.step") != nullptr;
    StateDict state = live_state();
    if (!from_stowage_train) {
      state.erase("optim");
      state.erase("progress");
    }
    dcp::load(state, *reader, {}, world_.group);
    if (progress_) {
      progress_->message(fmt::format("started from {} ({}) at step {}", path,
                                     from_stowage_train ? "model, optimizer and progress" : "model; a fresh optimizer",
                                     current_step()));
    }
  }

  int64_t current_step() const { return training_progress_->step(); }

  TrainOptions options_;
  // From the start, before the ranks meet: a notice during the rendezvous or --resume's
  // load is kept for the first step boundary.
  dist::PreemptionNotice notice_;
  dist::World world_;
  c10::Device device_;
  LanguageModel model_{nullptr};
  int64_t vocab_ = 0;
  c10::intrusive_ptr<optim::ZeroRedundancyOptimizer> optimizer_;
  std::unique_ptr<dist::GradientReducer> gradient_reducer_;  // with a group
  at::Generator data_generator_;
  // The step, and the states of data_generator_ and the default CPU generator.
  c10::intrusive_ptr<TrainingProgress> training_progress_;
  int64_t baseline_bytes_ = 0;
  int64_t resident_bytes_ = 0;  // optimizer state on the device between steps
  int64_t gradient_bytes_ = 0;  // gradients on the device between steps
  int64_t peak_activation_bytes_ = 0;
  std::string budget_plan_;      // with --activation-budget: what was picked
  int64_t peak_step_bytes_ = 0;  // the most device memory a step held beyond the parameters
  std::optional<dcp::CheckpointManager> checkpoints_;
  std::optional<std::pair<int64_t, std::string>> last_save_error_;  // the last save's step and error, if it failed
  Clock::time_point last_step_end_;
  Progress* progress_ = nullptr;
};

}  // namespace

std::string checkpoints_dir(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoints").string();
}

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
                  "activation peak fits SIZE (e.g. 24MiB) with the least recomputation; with --recompute-segments 0")
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
  cmd->add_option("--device", options->device,
                  "where the model trains: cpu, cuda:N, or cuda (each rank on cuda:LOCAL_RANK)")
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
  cmd->callback([options] {
    if (options->nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) {
      const int code = launch_ranks(options->nproc, /*port=*/0, std::chrono::seconds(5), own_command_line());
      if (code != 0) throw CLI::RuntimeError(code);
      return;
    }
    Trainer(*options).run();
  });
}

}  // namespace stowage::cli
