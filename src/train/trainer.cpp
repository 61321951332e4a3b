#include <stowage/train/trainer.h>

#include <stowage/dcp/filesystem.h>
#include <stowage/dist/gradient_reducer.h>
#include <stowage/error.h>
#include <stowage/memory/accounting.h>
#include <stowage/memory/host_buffer.h>
#include <stowage/state/stateful.h>
#include <stowage/state/training_progress.h>

#include "train/checkpoint_host_budget.h"
#include "util/intra_op_threads.h"

#include <ATen/ops/full.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <unordered_set>
#include <vector>

namespace stowage::train {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "SIGTERM".
std::string signal_name_of(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation != nullptr ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signal);
}

// The memory tier's options with its directory (default_memory_directory when empty).
dcp::MemoryTierOptions memory_tier_options(const TrainerOptions& options) {
  dcp::MemoryTierOptions memory = options.memory_checkpoints();
  if (memory.directory().empty()) memory.directory(default_memory_directory(options.run_dir()));
  return memory;
}

void check_host_budget_options(const TrainerOptions& options) {
  const int64_t budget = options.checkpoint_host_budget_bytes();
  if (budget < 0) {
    throw InvalidArgument(
        fmt::format("TrainerOptions: checkpoint_host_budget_bytes must not be negative, got {}", budget));
  }
  if (budget > 0 && options.checkpoints().save_every() == 0) {
    throw InvalidArgument(fmt::format(
        "TrainerOptions: checkpoint_host_budget_bytes {} needs checkpoints (save_every > 0) to bound", budget));
  }
  if (budget > 0 && options.checkpoints().save_options().staging_budget_bytes() != 0) {
    throw InvalidArgument(
        fmt::format("TrainerOptions: checkpoint_host_budget_bytes {} sets the staging budget; checkpoints' "
                    "save_options().staging_budget_bytes {} must stay 0",
                    budget, options.checkpoints().save_options().staging_budget_bytes()));
  }
}

void check_options(const TrainerOptions& options) {
  if (options.run_dir().empty()) throw InvalidArgument("TrainerOptions: run_dir is empty");
  if (options.memory_checkpoints().save_every() > 0 && options.checkpoints().save_every() == 0) {
    throw InvalidArgument("TrainerOptions: memory_checkpoints need checkpoints (save_every > 0) to fall back to");
  }
  if (options.steps() < 1) {
    throw InvalidArgument(fmt::format("TrainerOptions: steps must be at least 1, got {}", options.steps()));
  }
  if (options.zero_stage() != 1 && options.zero_stage() != 2) {
    throw InvalidArgument(fmt::format("TrainerOptions: zero_stage must be 1 or 2, got {}", options.zero_stage()));
  }
  if (options.resume() && !options.resume_from().empty()) {
    throw InvalidArgument(
        fmt::format("TrainerOptions: resume and resume_from '{}' exclude each other", options.resume_from()));
  }
  dcp::check_checkpoint_manager_options(options.checkpoints());
  dcp::check_memory_tier_options(memory_tier_options(options));
  if (options.cpu_cache_bytes() < 0) {
    throw InvalidArgument(
        fmt::format("TrainerOptions: cpu_cache_bytes must not be negative, got {}", options.cpu_cache_bytes()));
  }
  if (options.tokens_per_step() < 0) {
    throw InvalidArgument(
        fmt::format("TrainerOptions: tokens_per_step must not be negative, got {}", options.tokens_per_step()));
  }
  check_host_budget_options(options);
}

// The bytes of the storages behind `tensors`, each counted once: a gradient that is a
// view of the GradientReducer's bucket counts the bucket.
int64_t storage_bytes(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      bytes += static_cast<int64_t>(t.storage().nbytes());
    }
  }
  return bytes;
}

// Runs `work` on every rank and makes its failure on any rank every rank's: the rank that
// failed rethrows its own error, the others an Error naming it, so that no rank goes on
// into a collective that the failed one will not reach.
void run_agreed(const std::optional<dist::ProcessGroup>& group, const std::function<void()>& work) {
  std::exception_ptr failure;
  std::string outcome;  // empty: done; else "!" and the error's message
  try {
    work();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    outcome = std::string("!") + e.what();
  }
  if (group) {
    const std::vector<std::string> outcomes = group->all_gather(outcome);
    for (size_t rank = 0; rank < outcomes.size() && !failure; ++rank) {
      if (!outcomes[rank].empty()) throw Error(fmt::format("rank {}: {}", rank, outcomes[rank].substr(1)));
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

std::string default_memory_directory(const std::string& run_dir) {
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a: the same on every rank and every restart
  for (const char c : fs::absolute(run_dir).lexically_normal().string()) {
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  }
  return fmt::format("/dev/shm/stowage-{:016x}", hash);
}

struct Trainer::Rep {
  explicit Rep(TrainerOptions options_in)
      : options((check_options(options_in), std::move(options_in))),
        cpu_cache(options.cpu_cache_bytes()),
        notice(options.preemption()),
        world(dist::join_world()),
        device(dist::rank_device(options.device())) {}

  void make_optimizer(const OptimizerFactory& make, at::Generator data);
  void claim_run_directory();
  int64_t restore_latest();
  void restore_from_tiers();
  void save_to_memory_if_due(int64_t step);
  // To the events: a replication of the memory tier that ended (nothing if none).
  void report_replication(const std::optional<dcp::ReplicationReport>& replication);
  void start_from_other_checkpoint();
  void measure_step(StepRecord& record);
  void plan_host_budget();
  void measure_checkpoint_host();
  void save_if_due(int64_t step);
  // Measures the host bytes checkpointing holds, then reports each save with its peak.
  void report(std::vector<dcp::SaveReport> saves);
  void preempt(bool trained);
  StateDict live_state();
  void message(const std::string& text) const {
    if (events) events->message(text);
  }

  TrainerOptions options;
  memory::ScopedCpuCacheLimit cpu_cache;
  // From the start, before the ranks meet: a notice during the rendezvous or the restore
  // is kept for the first step boundary.
  dist::PreemptionNotice notice;
  dist::World world;
  c10::Device device;
  std::shared_ptr<EventSink> events;  // rank 0's
  std::shared_ptr<torch::nn::Module> model;
  c10::intrusive_ptr<optim::ZeroRedundancyOptimizer> optimizer;
  std::unique_ptr<dist::GradientReducer> reducer;  // with a group
  c10::intrusive_ptr<TrainingProgress> progress;
  std::optional<dcp::CheckpointManager> checkpoints;
  std::optional<dcp::MemoryTier> memory_tier;  // with memory_checkpoints

  int64_t baseline_bytes = 0;  // the parameters and what came before them
  int64_t before_forward_bytes = 0;
  RunSummary summary;
  // The host bytes checkpointing held at their peak: since the last measurement, and
  // for each save not reported yet (by step), since it started.
  int64_t checkpoint_host_peak = 0;
  std::map<int64_t, int64_t> save_host_peaks;
  // The memory tier's files, measured after each call that changes them (a save, a
  // restore), not at every step: listing them is file-system work.
  int64_t memory_tier_bytes = 0;
  bool trained_any = false;
  std::optional<std::pair<int64_t, std::string>> last_save_error;  // its step and error
  Clock::time_point run_start, last_step_end;
  bool restored = false;
  bool preempted = false;
  bool finished = false;
};

void Trainer::Rep::make_optimizer(const OptimizerFactory& make, at::Generator data) {
  baseline_bytes = memory::memory_allocated(device);
  const std::vector<at::Tensor> params = model->parameters();
  if (world.group) {
    // Every rank starts from rank 0's parameters, as under DDP, whatever it was seeded with.
    for (const at::Tensor& param : params) {
      at::Tensor weights = param.detach();  // the parameter's own storage
      world.group->broadcast(weights, 0);
    }
  }
  optim::ZeroRedundancyOptimizerOptions zero_options;
  zero_options.swap(options.swap());
  optimizer = c10::make_intrusive<optim::ZeroRedundancyOptimizer>(params, make, world.group, zero_options);
  if (world.group) {
    auto reducer_options = dist::GradientReducerOptions()
                               .gradient_as_bucket_view(options.gradient_as_bucket_view())
                               .broadcast_buffers(options.broadcast_buffers());
    if (options.zero_stage() == 2) reducer_options.gradient_owners(optimizer->owners());
    reducer = std::make_unique<dist::GradientReducer>(params, model->buffers(), *world.group, reducer_options);
  }
  progress = c10::make_intrusive<TrainingProgress>(std::move(data), std::vector<c10::Device>{device});
}

// Every rank checks the run directory (it reads only), then rank 0 writes run.json and
// opens the events; each step is agreed, so that a refusal or a failure is every rank's
// error and none waits for the others in a collective.
void Trainer::Rep::claim_run_directory() {
  run_agreed(world.group, [&] {
    check_run_directory(options.run_dir(), options.config(), options.resume(), options.allow_config_change());
  });
  run_agreed(world.group, [&] {
    if (world.rank != 0) return;
    write_run_config(options.run_dir(), options.config());
    const std::string metrics_path = (fs::path(options.run_dir()) / "metrics.jsonl").string();
    events = options.events() ? options.events()(metrics_path) : std::make_shared<MetricsFile>(metrics_path);
  });
  checkpoints.emplace(checkpoints_directory(options.run_dir()), options.checkpoints(), world.group);
  if (options.memory_checkpoints().save_every() > 0) {
    run_agreed(world.group, [&] {
      memory_tier.emplace(memory_tier_options(options), dcp::node_layout_from_env(world.size), world.group);
    });
  }
}

// Everything a resumed run needs: model (parameters and buffers), optimizer (swapped
// state included), and the progress (the step, every generator and with them the data
// position). Across ranks, the optimizer states are each rank's own and everything else
// is replicated (written once).
StateDict Trainer::Rep::live_state() {
  StateDict state;
  state.insert("model", as_ivalue(model));
  state.insert("optim", as_ivalue(c10::intrusive_ptr<Stateful>(optimizer)));
  state.insert("progress", as_ivalue(progress));
  return state;
}

// The newest step every rank can get from memory, a peer's replica or storage
// (dcp::MemoryTier::restore); rank 0 says what was skipped and which tier it came from.
void Trainer::Rep::restore_from_tiers() {
  StateDict state = live_state();
  const dcp::TierRestore restored = memory_tier->restore(state, *checkpoints);
  memory_tier_bytes = memory_tier->held_bytes();
  for (const std::string& line : restored.skipped) message("resume: skipped " + line);
  if (events) events->restore(restored);
  if (!restored.step) {
    message(fmt::format("resume: no checkpoint in memory nor in {}: starting from step 0", checkpoints->directory()));
    return;
  }
  const std::string fetched = restored.fetched_ranks.empty()
                                  ? ""
                                  : fmt::format(", ranks {} fetched theirs", fmt::join(restored.fetched_ranks, ", "));
  message(fmt::format("resume: from {} (step {}{})", dcp::restore_tier_name(restored.tier), progress->step(), fetched));
}

void Trainer::Rep::save_to_memory_if_due(int64_t step) {
  if (!memory_tier || !memory_tier->should_save(step)) return;
  const dcp::MemorySaveReport report = memory_tier->save(step, live_state());
  memory_tier_bytes = memory_tier->held_bytes();
  report_replication(report.previous_replication);
  if (events) events->memory_checkpoint(report);
  if (!report.error.empty() && events) {
    events->warning(fmt::format("the memory checkpoint of step {} failed: {}", step, report.error));
  }
}

void Trainer::Rep::report_replication(const std::optional<dcp::ReplicationReport>& replication) {
  if (!replication || !events) return;
  events->memory_replication(*replication);
  if (!replication->error.empty()) {
    events->warning(
        fmt::format("the replication of memory checkpoint {} failed: {}", replication->step, replication->error));
  }
}

// A committed checkpoint that cannot be read is skipped for the next older one, and
// rank 0 says which were skipped and which one the run resumed from.
int64_t Trainer::Rep::restore_latest() {
  if (memory_tier) {
    restore_from_tiers();
    return progress->step();
  }
  StateDict state = live_state();
  std::vector<dcp::SkippedCheckpoint> skipped;
  const auto report_skipped = [&] {
    for (const dcp::SkippedCheckpoint& checkpoint : skipped) {
      message(fmt::format("resume: skipped {}: {}", checkpoint.path, checkpoint.error));
    }
  };
  std::optional<int64_t> step;
  try {
    step = checkpoints->restore(state, {}, &skipped);
  } catch (...) {
    report_skipped();  // none could be read: the error says so
    throw;
  }
  report_skipped();
  if (!step) {
    message(fmt::format("resume: no committed checkpoint in {}: starting from step 0", checkpoints->directory()));
  } else {
    message(fmt::format("resume: from {} (step {})", checkpoints->checkpoint_path(*step), progress->step()));
  }
  return progress->step();
}

// A checkpoint a Trainer wrote (it holds the progress entries) gives everything
// live_state() holds, checked strictly as a resume is; any other gives the model's
// weights alone, with a fresh optimizer at step 0 (another optimizer's state is not
// this one's).
void Trainer::Rep::start_from_other_checkpoint() {
  const std::string& path = options.resume_from();
  std::unique_ptr<dcp::StorageReader> reader;
  bool from_trainer = false;
  run_agreed(world.group, [&] {
    reader = options.open_checkpoint()(path);
    dcp::Metadata metadata = reader->read_metadata();
    metadata.index();
    from_trainer = metadata.find("progress.step") != nullptr;
  });
  StateDict state = live_state();
  if (!from_trainer) {
    state.erase("optim");
    state.erase("progress");
  }
  dcp::load(state, *reader, {}, world.group);
  message(fmt::format("started from {} ({}) at step {}", path,
                      from_trainer ? "model, optimizer and progress" : "model; a fresh optimizer", progress->step()));
}

void Trainer::Rep::report(std::vector<dcp::SaveReport> saves) {
  measure_checkpoint_host();
  for (dcp::SaveReport& save : saves) {
    save.host_peak_bytes = save_host_peaks[save.step];
    save_host_peaks.erase(save.step);
    // Every rank sees the same outcome of each save: every rank ends with the same status.
    last_save_error.reset();
    if (!save.committed) last_save_error.emplace(save.step, save.error);
    if (events) events->checkpoint(save);
  }
}

void Trainer::Rep::save_if_due(int64_t step) {
  // The last step is saved too, so that a resumed run continues from where this one ended.
  const bool last_step = options.checkpoints().save_every() > 0 && step == options.steps();
  if (checkpoints->should_save(step) || last_step) {
    if (checkpoints->save(step, live_state(), /*force=*/last_step)) save_host_peaks[step] = 0;
  }
}

// Ends a preempted run: saves the step it is on (unless the run has no checkpoints, or
// no step was trained since the checkpoint it resumed from). Every rank gets here at the
// same step (PreemptionNotice::agreed).
void Trainer::Rep::preempt(bool trained) {
  const std::string signal = signal_name_of(notice.signal_number());
  const auto start = Clock::now();
  std::string saved = "nothing to save: no step was trained";
  if (trained && options.checkpoints().save_every() == 0) {
    saved = "no checkpoint: the run saves none";
  } else if (trained) {
    message(fmt::format("{}: saving step {} before exiting", signal, progress->step()));
    save_host_peaks.emplace(progress->step(), 0);
    report(checkpoints->save_now(progress->step(), live_state()));
    if (last_save_error) {
      throw Error(fmt::format("{}: the checkpoint of step {} failed, the run ends without it: {}", signal,
                              progress->step(), last_save_error->second));
    }
    saved = fmt::format("step {} committed in {:.3f} s", progress->step(), seconds_since(start));
  }
  // No rank exits before every rank is past the commit. Disarmed only then, so that a
  // second signal or the grace deadline still ends a rank that waits for a dead one.
  if (world.group) world.group->barrier();
  notice.disarm();  // the job ends on its own terms now: a signal still to come is ignored
  message(fmt::format("preempted by {} at step {}: {}; exiting with status {} (a resume continues)", signal,
                      progress->step(), saved, dist::kPreemptedStatus));
  preempted = true;
}

// The step's memory figures, after the update.
void Trainer::Rep::measure_step(StepRecord& record) {
  std::vector<at::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad());
  // With copies (gradient_as_bucket_view false), the reducer's buckets hold gradients too.
  record.gradient_bytes =
      storage_bytes(grads) + (reducer && !options.gradient_as_bucket_view() ? reducer->kept_bucket_bytes() : 0);
  // Counted from the state tensors: a save's background thread allocates too (on the CPU).
  record.optimizer_resident_bytes = optimizer->resident_state_bytes();
  record.peak_step_bytes = memory::max_memory_allocated(device) - baseline_bytes;
  const memory::HostBufferStats host = memory::host_buffer_stats();
  record.checkpoint_host_bytes = host.checkpoint_bytes;
  record.optimizer_host_bytes = host.optimizer_bytes;
}

// Splits the host budget between the memory tier's reserve and staging, which the
// checkpoints' saves then keep to; refuses a budget too small, before the first step,
// the same on every rank (the largest replica is any rank's).
void Trainer::Rep::plan_host_budget() {
  const int64_t budget = options.checkpoint_host_budget_bytes();
  if (budget == 0) return;
  const dcp::StagingFootprint footprint = detail::first_save_footprint(live_state(), optimizer->local_optimizer());
  const int64_t own_bytes = detail::checkpoint_file_bytes(footprint);
  int64_t largest_bytes = own_bytes;
  if (world.group) {
    for (const std::string& bytes : world.group->all_gather(std::to_string(own_bytes))) {
      largest_bytes = std::max<int64_t>(largest_bytes, std::stoll(bytes));
    }
  }
  run_agreed(world.group, [&] {
    int64_t tier_reserve = 0;
    if (options.memory_checkpoints().save_every() > 0) {
      const bool replicated = dcp::node_layout_from_env(world.size).ranks_per_node < world.size;
      tier_reserve = detail::memory_tier_reserve(options.memory_checkpoints().keep_last(), own_bytes,
                                                 replicated ? std::optional<int64_t>(largest_bytes) : std::nullopt);
    }
    options.checkpoints().save_options().staging_budget_bytes(detail::staging_budget(budget, footprint, tier_reserve));
  });
  summary.checkpoint_host_budget_bytes = budget;
}

// Host bytes checkpointing holds, measured: the staging buffers' high-water mark since
// the last measurement and the memory tier's files as its last save or restore left them.
void Trainer::Rep::measure_checkpoint_host() {
  const int64_t staging_peak = memory::host_buffer_stats().checkpoint_peak_bytes;
  memory::reset_peak_host_buffer_stats();
  checkpoint_host_peak = staging_peak + memory_tier_bytes;
  summary.checkpoint_host_peak_bytes = std::max(summary.checkpoint_host_peak_bytes, checkpoint_host_peak);
  for (auto& [step, peak] : save_host_peaks) peak = std::max(peak, checkpoint_host_peak);
}

Trainer::Trainer(TrainerOptions options) : rep_(std::make_unique<Rep>(std::move(options))) {
  memory::enable_accounting();
}

Trainer::~Trainer() = default;

const dist::World& Trainer::world() const {
  return rep_->world;
}

c10::Device Trainer::device() const {
  return rep_->device;
}

const TrainerOptions& Trainer::options() const {
  return rep_->options;
}

optim::ZeroRedundancyOptimizer& Trainer::optimizer() {
  if (!rep_->optimizer) throw InvalidArgument("Trainer::optimizer: before prepare()");
  return *rep_->optimizer;
}

EventSink* Trainer::events() {
  return rep_->events.get();
}

int64_t Trainer::step() const {
  return rep_->progress ? rep_->progress->step() : 0;
}

void Trainer::prepare(std::shared_ptr<torch::nn::Module> model, const OptimizerFactory& make_optimizer,
                      at::Generator data) {
  Rep& r = *rep_;
  if (r.model) throw InvalidArgument("Trainer::prepare: called twice");
  if (!model) throw InvalidArgument("Trainer::prepare: no model");
  for (const auto& p : model->parameters()) {
    if (p.device() != r.device) {
      throw InvalidArgument(fmt::format("Trainer::prepare: the model has a parameter on {}, not on the rank's {}",
                                        p.device().str(), r.device.str()));
    }
  }
  r.model = std::move(model);
  r.make_optimizer(make_optimizer, std::move(data));
  r.plan_host_budget();
  r.claim_run_directory();
  const std::string blas_conflict = util::blas_thread_conflict();
  if (!blas_conflict.empty() && r.events) r.events->warning(blas_conflict);
}

int64_t Trainer::restore() {
  Rep& r = *rep_;
  if (!r.checkpoints) throw InvalidArgument("Trainer::restore: before prepare()");
  if (r.restored) throw InvalidArgument("Trainer::restore: called twice");
  r.restored = true;
  if (r.options.resume()) r.restore_latest();
  if (!r.options.resume_from().empty()) r.start_from_other_checkpoint();
  r.summary.first_step = r.progress->step() + 1;
  r.run_start = r.last_step_end = Clock::now();
  if (r.notice.agreed(r.world.group)) {
    r.preempt(/*trained=*/false);
    return r.options.steps() + 1;
  }
  if (r.summary.first_step > r.options.steps()) {
    r.message(fmt::format("nothing to do: the run is already at step {}", r.progress->step()));
  }
  return r.summary.first_step;
}

void Trainer::begin_step() {
  Rep& r = *rep_;
  if (!r.restored) throw InvalidArgument("Trainer::begin_step: before prepare() and restore()");
  if (r.reducer) {
    r.reducer->zero_grad();  // in place: the gradients are views of its buckets
  } else {
    r.model->zero_grad();
  }
  memory::reset_peak_memory_stats(r.device);
  r.before_forward_bytes = memory::memory_allocated(r.device);
}

bool Trainer::end_step(int64_t step, double loss) {
  Rep& r = *rep_;
  if (!r.restored) throw InvalidArgument("Trainer::end_step: before prepare() and restore()");
  if (step != r.progress->step() + 1 || r.preempted) {
    throw InvalidArgument(fmt::format("Trainer::end_step: step {} is not the next one ({}){}", step,
                                      r.progress->step() + 1, r.preempted ? ", and the run was preempted" : ""));
  }
  if (r.reducer) {
    r.reducer->synchronize();  // the gradients averaged, rank 0's buffers everywhere
    at::Tensor mean = at::full({1}, loss, at::kDouble);
    r.world.group->all_reduce_sum(mean);
    loss = mean.item<double>() / static_cast<double>(r.world.size);
  }
  StepRecord record;
  record.step = step;
  record.total_steps = r.options.steps();
  record.loss = loss;
  record.peak_activation_bytes = memory::max_memory_allocated(r.device) - r.before_forward_bytes;
  // The snapshot of the last checkpoint must be complete before the update changes what
  // it copies; staging overlapped with this step's forward and backward.
  r.checkpoints->wait_for_staging();
  r.optimizer->step();
  r.progress->set_step(step);
  const auto end = Clock::now();
  record.step_s = std::chrono::duration<double>(end - r.last_step_end).count();
  r.last_step_end = end;
  if (r.options.tokens_per_step() > 0)
    record.tokens_per_s = static_cast<double>(r.options.tokens_per_step()) / record.step_s;
  r.measure_step(record);
  r.save_to_memory_if_due(step);
  r.save_if_due(step);
  r.report(r.checkpoints->poll());
  record.checkpoint_host_peak_bytes = r.checkpoint_host_peak;
  if (!r.trained_any) r.summary.first_loss = loss;
  r.trained_any = true;
  r.summary.last_step = step;
  r.summary.last_loss = loss;
  r.summary.peak_activation_bytes = std::max(r.summary.peak_activation_bytes, record.peak_activation_bytes);
  r.summary.peak_step_bytes = std::max(r.summary.peak_step_bytes, record.peak_step_bytes);
  r.summary.optimizer_resident_bytes = record.optimizer_resident_bytes;
  r.summary.gradient_bytes = record.gradient_bytes;
  if (r.events) r.events->step(record);
  if (!r.notice.agreed(r.world.group)) return true;
  r.preempt(/*trained=*/true);
  return false;
}

int Trainer::finish() {
  Rep& r = *rep_;
  if (!r.restored) throw InvalidArgument("Trainer::finish: before prepare() and restore()");
  if (r.finished) return r.summary.exit_status;
  try {
    r.report(r.checkpoints->wait());
  } catch (...) {  // the failure policy threw: the run failed, and says so again if asked
    r.finished = true;
    r.summary.exit_status = 1;
    throw;
  }
  r.finished = true;
  r.summary.seconds = seconds_since(r.run_start);
  if (!r.trained_any) r.summary.last_step = r.summary.first_step - 1;
  r.summary.exit_status = r.preempted ? dist::kPreemptedStatus : r.last_save_error ? 1 : 0;
  if (r.last_save_error && r.events) {
    r.events->warning(
        fmt::format("the last checkpoint (step {}) failed: {}", r.last_save_error->first, r.last_save_error->second));
  }
  if (r.memory_tier) r.report_replication(r.memory_tier->finish_replication());
  // Every step trained and kept in storage: the memory tier has nothing left to offer.
  if (r.memory_tier && r.summary.exit_status == 0 && r.progress->step() == r.options.steps()) {
    r.memory_tier->clear();
  }
  if (r.events) r.events->end(r.summary);
  return r.summary.exit_status;
}

}  // namespace stowage::train
