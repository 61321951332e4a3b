// `stowage bench train`: the tokens per second of `stowage train` (its default model,
// data, batch and activation checkpointing, plain AdamW, an asynchronous checkpoint
// every K steps), run as the real command in a child process; with --peer, against the
// same training in PyTorch (bench/peer/train_peer.py: the same model, the same batches,
// checkpoint_sequential, torch.optim.AdamW, dcp.async_save with a DefaultStager), the
// two taking turns round by round, on 1 or 2 ranks (--nproc). Besides tokens per second
// it reports each side's dip: how much slower the steps right after a checkpoint are
// than the steps far from any (issue 24); and stowage's far steps against the steps of
// the same run without checkpoints, run in the same rounds, and against its steps before
// the first checkpoint (issue 37: a save must not change the steps after it).
#include "cli_numbers.h"
#include "bench_commands.h"
#include "train_options.h"
#include "train_run.h"

#include <bench_util.h>
#include <emit.h>
#include <python_peer.h>

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <utility>

namespace stowage::cli {
namespace {

// `stowage train`'s defaults with plain AdamW, the optimizer of the PyTorch script.
TrainOptions plain_adamw_run() {
  TrainOptions run;
  run.swap_times = 0;
  return run;
}

struct TrainBenchOptions {
  // The run both sides train, every option given to both explicitly so that they train the
  // same thing whatever `stowage train`'s defaults become.
  TrainOptions train = plain_adamw_run();
  int rounds = 3;
  int64_t dip_window = 5;  // steps after each checkpoint that the dip is measured over
  std::string dir;         // scratch space; empty: the system temp directory
  bool peer = false;
  bool json = false;
};

// One training run's time over its steps (from before the first to after the last
// checkpoint committed), its first and last losses, and (rank 0's) per-step times: a
// step's time runs from the end of the step before to the end of its own, so the step
// after a checkpoint includes the time the save blocked the loop and the wait for its
// staging (`stowage train`'s step_s, and train_peer.py's step_seconds alike).
struct TimedRun {
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
  std::vector<double> step_seconds;  // step 1 first
  // (checkpoint step, the step at whose end its commit was first seen)
  std::vector<std::pair<int64_t, int64_t>> commits_seen;
};

// ---------------------------------------------------------------------------- the dip
// The steps a checkpoint slows down are the K (--dip-window) after it; the baseline is
// the median of the steps far from every checkpoint. Both sides are judged by the same
// steps of the same schedule.

// The first steps allocate and fill caches: neither window nor baseline.
constexpr int64_t kDipWarmupSteps = 5;

struct DipSchedule {
  std::vector<int64_t> checkpoints;           // the steps a save follows, the last step included
  std::vector<std::vector<int64_t>> windows;  // a checkpoint's steps c+1..c+K (past the warm-up), if any
  std::vector<int64_t> far;                   // past the warm-up, and outside every c-1..c+K
  std::string unmeasured;                     // why the run has no dip to measure; empty: it has
};

DipSchedule dip_schedule(const TrainBenchOptions& o) {
  DipSchedule schedule;
  if (o.train.ckpt_every <= 0) return schedule;
  if (o.train.ckpt_every <= o.dip_window + 1) {
    // Windows would overlap, each holding the next checkpoint's own slowed steps.
    schedule.unmeasured =
        fmt::format("--ckpt-every {} leaves no room for --dip-window {}: give a --ckpt-every above {}",
                    o.train.ckpt_every, o.dip_window, o.dip_window + 1);
    return schedule;
  }
  for (int64_t step = o.train.ckpt_every; step <= o.train.steps; step += o.train.ckpt_every)
    schedule.checkpoints.push_back(step);
  if (schedule.checkpoints.empty() || schedule.checkpoints.back() != o.train.steps)
    schedule.checkpoints.push_back(o.train.steps);
  std::vector<bool> near(static_cast<size_t>(o.train.steps + 1), false);
  for (const int64_t checkpoint : schedule.checkpoints) {
    std::vector<int64_t> window;
    for (int64_t step = std::max<int64_t>(checkpoint - 1, 1);
         step <= std::min(checkpoint + o.dip_window, o.train.steps); ++step) {
      near[static_cast<size_t>(step)] = true;
      if (step > checkpoint && step > kDipWarmupSteps) window.push_back(step);
    }
    if (!window.empty()) schedule.windows.push_back(std::move(window));
  }
  for (int64_t step = kDipWarmupSteps + 1; step <= o.train.steps; ++step) {
    if (!near[static_cast<size_t>(step)]) schedule.far.push_back(step);
  }
  if (schedule.windows.empty() || schedule.far.empty()) {
    schedule.unmeasured = fmt::format(
        "--steps {} --ckpt-every {} --dip-window {} leave no {} (the first {} steps are warm-up): give more "
        "--steps, or a --ckpt-every that leaves more than --dip-window + 2 steps between checkpoints",
        o.train.steps, o.train.ckpt_every, o.dip_window,
        schedule.windows.empty() ? "steps after a checkpoint" : "steps far from every checkpoint", kDipWarmupSteps);
  }
  return schedule;
}

// One run's dip, as fractions (0.02: 2% slower than the baseline).
struct Dip {
  double mean = 0;        // mean of every window's steps / baseline - 1
  double worst = 0;       // the slowest checkpoint's window mean / baseline - 1
  double baseline_s = 0;  // median far step
  // The most steps from a checkpoint (the last excepted) to the end of the step at
  // which its commit was seen: more than the window, and far steps overlap the write.
  int64_t commit_lag_steps = 0;
};

double mean_step_seconds(const std::vector<double>& step_seconds, const std::vector<int64_t>& steps) {
  double total = 0;
  for (const int64_t step : steps) total += step_seconds[static_cast<size_t>(step - 1)];
  return total / static_cast<double>(steps.size());
}

double median_step_seconds(const std::vector<double>& step_seconds, const std::vector<int64_t>& steps) {
  std::vector<double> seconds;
  seconds.reserve(steps.size());
  for (const int64_t step : steps) seconds.push_back(step_seconds[static_cast<size_t>(step - 1)]);
  return bench::median(seconds);
}

Dip measure_dip(const TimedRun& run, const DipSchedule& schedule, const std::string& side) {
  const size_t steps = static_cast<size_t>(schedule.checkpoints.back());
  if (run.step_seconds.size() != steps) {
    throw Error(fmt::format("bench train: {} reported the times of {} steps, not of its {}", side,
                            run.step_seconds.size(), steps));
  }
  Dip dip;
  dip.baseline_s = median_step_seconds(run.step_seconds, schedule.far);
  std::vector<int64_t> all_window_steps;
  double slowest_window_s = 0;
  for (const std::vector<int64_t>& window : schedule.windows) {
    all_window_steps.insert(all_window_steps.end(), window.begin(), window.end());
    slowest_window_s = std::max(slowest_window_s, mean_step_seconds(run.step_seconds, window));
  }
  dip.mean = mean_step_seconds(run.step_seconds, all_window_steps) / dip.baseline_s - 1;
  dip.worst = slowest_window_s / dip.baseline_s - 1;
  for (const auto& [checkpoint, seen] : run.commits_seen) {
    if (checkpoint < schedule.checkpoints.back())
      dip.commit_lag_steps = std::max(dip.commit_lag_steps, seen - checkpoint);
  }
  return dip;
}

// `stowage train` itself, plain AdamW (--swap-times 0) as the PyTorch script's, in a new
// run directory, with one progress line (the last step's). Its time is its end record's:
// the loop, without the process's start-up and the model's construction.
TimedRun run_stowage_train(TrainOptions train, const bench::Scratch& scratch) {
  train.run_dir = scratch.sub("stowage-run");
  train.log_every = train.steps;
  const TrainRecords records =
      run_train_or_throw(train, scratch.sub("stowage-train.log"), "bench train: `stowage train`");
  TimedRun run;
  for (const train::StepRecord& step : records.steps) run.step_seconds.push_back(step.step_s);
  run.commits_seen = records.commits_seen;
  run.seconds = records.end->seconds;
  run.first_loss = records.end->first_loss;
  run.last_loss = records.end->last_loss;
  if (static_cast<int64_t>(run.step_seconds.size()) != train.steps) {
    throw Error(fmt::format("bench train: `stowage train` reported {} steps, not its {}", run.step_seconds.size(),
                            train.steps));
  }
  if (run.seconds <= 0) {
    throw Error(
        fmt::format("bench train: {} steps took `stowage train` no measurable time: give more --steps", train.steps));
  }
  return run;
}

TimedRun run_pytorch_train(const TrainBenchOptions& o, const bench::Scratch& scratch, bench::PythonPeer& peer) {
  const std::string run_dir = scratch.sub("pytorch-run");
  std::filesystem::remove_all(run_dir);
  nlohmann::json request =
      train_options_json(o.train, {"corpus", "steps", "batch", "seq_len", "layers", "width", "heads", "lr", "seed",
                                   "threads", "recompute_segments", "ckpt_every", "keep", "nproc"});
  request["op"] = "train";
  request["run_dir"] = run_dir;
  const nlohmann::json answer = peer.request(request);
  for (const auto& path : answer.at("checkpoints")) {
    if (!std::filesystem::exists(path.get<std::string>() + "/.metadata")) {
      throw Error(fmt::format("bench train: the PyTorch script's checkpoint {} has no .metadata", path.dump()));
    }
  }
  std::filesystem::remove_all(run_dir);
  TimedRun run;
  run.seconds = answer.at("seconds").get<double>();
  run.first_loss = answer.at("first_loss").get<double>();
  run.last_loss = answer.at("last_loss").get<double>();
  run.step_seconds = answer.at("step_seconds").get<std::vector<double>>();
  for (const auto& commit : answer.at("commits")) {
    run.commits_seen.emplace_back(commit.at(0).get<int64_t>(), commit.at(1).get<int64_t>());
  }
  return run;
}

std::vector<double> seconds_of_each(const std::vector<TimedRun>& runs) {
  std::vector<double> seconds;
  seconds.reserve(runs.size());
  for (const TimedRun& run : runs) seconds.push_back(run.seconds);
  return seconds;
}

// The medians of the rounds' figures, as "<prefix>tokens_per_s" and the like.
void add_runs(nlohmann::json& out, const std::string& prefix, const std::vector<TimedRun>& runs, int64_t tokens) {
  const double median_s = bench::median(seconds_of_each(runs));
  out[prefix + "seconds"] = median_s;
  out[prefix + "tokens_per_s"] = static_cast<double>(tokens) / median_s;
  out[prefix + "first_loss"] = runs.back().first_loss;
  out[prefix + "last_loss"] = runs.back().last_loss;
}

// The medians of the rounds' dips, as "<prefix>dip_mean" and the like, with each
// round's mean; the commit lag is the rounds' largest.
void add_dips(nlohmann::json& out, const std::string& prefix, const std::vector<TimedRun>& runs,
              const DipSchedule& schedule, const std::string& side) {
  std::vector<double> means, worsts, baselines;
  int64_t commit_lag_steps = 0;
  for (const TimedRun& run : runs) {
    const Dip dip = measure_dip(run, schedule, side);
    means.push_back(dip.mean);
    worsts.push_back(dip.worst);
    baselines.push_back(dip.baseline_s);
    commit_lag_steps = std::max(commit_lag_steps, dip.commit_lag_steps);
  }
  out[prefix + "dip_mean"] = bench::median(means);
  out[prefix + "dip_worst"] = bench::median(worsts);
  out[prefix + "dip_baseline_step_s"] = bench::median(baselines);
  out[prefix + "dip_commit_lag_steps"] = commit_lag_steps;
  out[prefix + "dip_mean_rounds"] = means;
}

// The dip's schedule and definition, each side's dips, and whether stowage's meets the
// issue's goal: a mean of at most 2%, and (with the peer) below PyTorch's.
void add_dip_figures(nlohmann::json& out, const TrainBenchOptions& o, const DipSchedule& schedule,
                     const std::vector<TimedRun>& stowage_runs, const std::vector<TimedRun>& pytorch_runs) {
  constexpr double kDipGoal = 0.02;
  out["dip_window"] = o.dip_window;
  out["dip_warmup_steps"] = kDipWarmupSteps;
  out["dip_window_steps"] = std::accumulate(schedule.windows.begin(), schedule.windows.end(), size_t{0},
                                            [](size_t total, const auto& window) { return total + window.size(); });
  out["dip_far_steps"] = schedule.far.size();
  out["dip_definition"] =
      "a step's time runs from the end of the step before to the end of its own; window: steps c+1..c+K after each "
      "checkpoint c but the last; far: the steps outside every c-1..c+K, past the warm-up; dip_mean: mean window step "
      "/ median far step - 1; dip_worst: the slowest checkpoint's window mean / median far step - 1; medians of the "
      "rounds";
  add_dips(out, "stowage_", stowage_runs, schedule, "`stowage train`");
  const double stowage_mean = out["stowage_dip_mean"].get<double>();
  bool met = stowage_mean <= kDipGoal;
  out["dip_target"] = "stowage's mean dip <= 2%";
  if (!pytorch_runs.empty()) {
    add_dips(out, "pytorch_", pytorch_runs, schedule, "the PyTorch script");
    met = met && stowage_mean < out["pytorch_dip_mean"].get<double>();
    out["dip_target"] = "stowage's mean dip <= 2% and below PyTorch's";
  }
  out["dip_target_met"] = met;
}

// The median of the times of `steps` in each of `runs`.
std::vector<double> median_step_of_each(const std::vector<TimedRun>& runs, const std::vector<int64_t>& steps) {
  std::vector<double> medians;
  medians.reserve(runs.size());
  for (const TimedRun& run : runs) medians.push_back(median_step_seconds(run.step_seconds, steps));
  return medians;
}

// Each round's a / b. The sides of a round run one after the other, so that a machine whose
// speed drifts for minutes at a time (this one's does, by up to 35%) shifts both alike.
std::vector<double> ratio_of_each_round(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  ratios.reserve(a.size());
  for (size_t round = 0; round < a.size(); ++round) ratios.push_back(a[round] / b[round]);
  return ratios;
}

// Whether the first checkpoint changes the speed of the steps after it (issue 37): the far
// steps after it against those before it, and the same steps of the run without
// checkpoints, whose ratio is this machine's drift alone (its host moves its CPUs between
// cores, which changes a step's time by a third at random moments). The change is each
// round's ratio of the two ratios, either way: max(x, 1/x); median of the rounds.
void add_first_checkpoint_figures(nlohmann::json& out, const DipSchedule& schedule,
                                  const std::vector<TimedRun>& stowage_runs,
                                  const std::vector<TimedRun>& unsaved_runs) {
  constexpr double kChangeLimit = 1.02;
  // schedule.far is in step order: the far steps before the first checkpoint come first.
  const auto first_after = std::lower_bound(schedule.far.begin(), schedule.far.end(), schedule.checkpoints.front());
  const std::vector<int64_t> before(schedule.far.begin(), first_after), after(first_after, schedule.far.end());
  if (before.empty() || after.empty()) return;
  const std::vector<double> saved_before = median_step_of_each(stowage_runs, before);
  const std::vector<double> saved_after = median_step_of_each(stowage_runs, after);
  const std::vector<double> saved = ratio_of_each_round(saved_after, saved_before);
  const std::vector<double> unsaved =
      ratio_of_each_round(median_step_of_each(unsaved_runs, after), median_step_of_each(unsaved_runs, before));
  std::vector<double> changes = ratio_of_each_round(saved, unsaved);
  for (double& change : changes) change = std::max(change, 1 / change);
  const double change = bench::median(changes);
  out["stowage_before_first_checkpoint_step_s"] = bench::median(saved_before);
  out["stowage_after_first_checkpoint_step_s"] = bench::median(saved_after);
  out["stowage_after_over_before_first_checkpoint_rounds"] = saved;
  out["no_checkpoint_after_over_before_rounds"] = unsaved;
  out["stowage_first_checkpoint_change"] = change;
  out["stowage_first_checkpoint_change_rounds"] = changes;
  out["stowage_first_checkpoint_change_limit"] = kChangeLimit;
  out["stowage_first_checkpoint_change_met"] = change <= kChangeLimit;
}

// Steps that run as steps run with no checkpoint (issue 37): the median far step (the dip's
// baseline, add_dip_figures) against the median step of the same run without checkpoints
// (the median of each round's ratio), and the far steps before the first checkpoint
// against those after it; medians of the rounds.
void add_steady_figures(nlohmann::json& out, const DipSchedule& schedule, const std::vector<TimedRun>& stowage_runs,
                        const std::vector<TimedRun>& unsaved_runs) {
  constexpr double kSteadyLimit = 1.02;
  std::vector<int64_t> all_past_warmup(static_cast<size_t>(schedule.checkpoints.back() - kDipWarmupSteps));
  std::iota(all_past_warmup.begin(), all_past_warmup.end(), kDipWarmupSteps + 1);
  const std::vector<double> steady = median_step_of_each(unsaved_runs, all_past_warmup);
  const std::vector<double> ratios = ratio_of_each_round(median_step_of_each(stowage_runs, schedule.far), steady);
  const double ratio = bench::median(ratios);
  out["stowage_no_checkpoint_step_s"] = bench::median(steady);
  out["stowage_far_over_no_checkpoint"] = ratio;
  out["stowage_far_over_no_checkpoint_rounds"] = ratios;
  out["stowage_far_over_no_checkpoint_limit"] = kSteadyLimit;
  out["stowage_far_over_no_checkpoint_met"] = ratio <= kSteadyLimit;
  add_first_checkpoint_figures(out, schedule, stowage_runs, unsaved_runs);
}

nlohmann::json run_train_bench(const TrainBenchOptions& o) {
  const DipSchedule schedule = dip_schedule(o);
  const bench::Scratch scratch(o.dir, "train");
  std::unique_ptr<bench::PythonPeer> peer;
  if (o.peer) peer = std::make_unique<bench::PythonPeer>("train_peer.py", std::vector<std::string>{});
  std::vector<TimedRun> stowage_runs, unsaved_runs, pytorch_runs;
  std::vector<std::function<void()>> turns{[&] { stowage_runs.push_back(run_stowage_train(o.train, scratch)); }};
  if (!schedule.checkpoints.empty() && schedule.unmeasured.empty()) {
    TrainOptions unsaved = o.train;  // the same run without checkpoints: the steady step
    unsaved.ckpt_every = 0;
    turns.emplace_back([&, unsaved] { unsaved_runs.push_back(run_stowage_train(unsaved, scratch)); });
  }
  if (peer) turns.emplace_back([&] { pytorch_runs.push_back(run_pytorch_train(o, scratch, *peer)); });
  for (int round = 0; round < o.rounds; ++round) bench::run_round(round, turns);

  const int64_t tokens = o.train.steps * o.train.batch * o.train.seq_len;
  nlohmann::json out = train_options_json(
      o.train, {"steps", "batch", "seq_len", "threads", "nproc", "recompute_segments", "ckpt_every"});
  out["tokens"] = tokens;
  out["optimizer"] = "AdamW, plain (stowage train --swap-times 0)";
  out["rounds"] = o.rounds;
  out["time_measured"] =
      "the training loop, from before the first step until the last checkpoint committed; median of the rounds, and "
      "of each round's ratio for a ratio of two sides";
  add_runs(out, "stowage_", stowage_runs, tokens);
  if (peer) {
    add_runs(out, "pytorch_", pytorch_runs, tokens);
    // Each round's ratio of the same tokens' times, PyTorch's over stowage's.
    const std::vector<double> ratios =
        ratio_of_each_round(seconds_of_each(pytorch_runs), seconds_of_each(stowage_runs));
    const double ratio = bench::median(ratios);
    out["stowage_over_pytorch_tokens_per_s"] = ratio;
    out["stowage_over_pytorch_tokens_per_s_rounds"] = ratios;
    out["stowage_over_pytorch_tokens_per_s_met"] = ratio >= 1;
  }
  if (!schedule.unmeasured.empty()) {
    out["dip_unmeasured"] = schedule.unmeasured;
  } else if (!schedule.checkpoints.empty()) {
    add_dip_figures(out, o, schedule, stowage_runs, pytorch_runs);
    add_steady_figures(out, schedule, stowage_runs, unsaved_runs);
  }
  return out;
}

// The dip's lines: each side's mean and worst, and the goal.
std::string dip_text(const nlohmann::json& r) {
  std::string out = fmt::format(
      "dip after a checkpoint: steps c+1..c+{} against the median of {} steps far from any checkpoint, median of {} "
      "rounds\n",
      r["dip_window"].get<int64_t>(), r["dip_far_steps"].get<int64_t>(), r["rounds"].get<int>());
  const auto line = [&r](const std::string& who, const std::string& prefix) {
    const int64_t lag = r[prefix + "dip_commit_lag_steps"].get<int64_t>();
    return fmt::format(
        "  {:<8} mean {:+6.1f}%  worst {:+6.1f}%  (far step {:.1f} ms; commits seen within {} steps{})\n", who,
        100 * r[prefix + "dip_mean"].get<double>(), 100 * r[prefix + "dip_worst"].get<double>(),
        1e3 * r[prefix + "dip_baseline_step_s"].get<double>(), lag,
        lag > r["dip_window"].get<int64_t>() ? ", past the window: far steps overlap writes" : "");
  };
  out += line("stowage", "stowage_");
  if (r.contains("pytorch_dip_mean")) out += line("PyTorch", "pytorch_");
  out += fmt::format("target: {}: {}\n", r["dip_target"].get<std::string>(),
                     r["dip_target_met"].get<bool>() ? "met" : "NOT met");
  out += fmt::format(
      "stowage's far step against the same run without checkpoints ({:.1f} ms): {:.3f} x, limit {:.2f}: {}\n",
      1e3 * r["stowage_no_checkpoint_step_s"].get<double>(), r["stowage_far_over_no_checkpoint"].get<double>(),
      r["stowage_far_over_no_checkpoint_limit"].get<double>(),
      r["stowage_far_over_no_checkpoint_met"].get<bool>() ? "met" : "NOT met");
  if (r.contains("stowage_first_checkpoint_change")) {
    out += fmt::format(
        "stowage's far steps before the first checkpoint {:.1f} ms, after it {:.1f} ms; the change against the same "
        "steps without checkpoints: {:.3f} x, limit {:.2f}: {}\n",
        1e3 * r["stowage_before_first_checkpoint_step_s"].get<double>(),
        1e3 * r["stowage_after_first_checkpoint_step_s"].get<double>(),
        r["stowage_first_checkpoint_change"].get<double>(), r["stowage_first_checkpoint_change_limit"].get<double>(),
        r["stowage_first_checkpoint_change_met"].get<bool>() ? "met" : "NOT met");
  }
  return out;
}

std::string train_bench_text(const nlohmann::json& r) {
  std::string out = fmt::format(
      "train benchmark: {} steps of {} tokens on {} rank(s), {} threads each, {} checkpoint segments, a checkpoint "
      "every {} steps, {}\n",
      r["steps"].get<int64_t>(), r["batch"].get<int64_t>() * r["seq_len"].get<int64_t>(), r["nproc"].get<int>(),
      r["threads"].get<int>(), r["recompute_segments"].get<int64_t>(), r["ckpt_every"].get<int64_t>(),
      r["optimizer"].get<std::string>());
  const auto line = [&r](const std::string& who, const std::string& prefix) {
    return fmt::format("  {:<8} {:8.0f} tok/s ({:.2f} s, median of {}), loss {:.3f} -> {:.3f}\n", who,
                       r[prefix + "tokens_per_s"].get<double>(), r[prefix + "seconds"].get<double>(),
                       r["rounds"].get<int>(), r[prefix + "first_loss"].get<double>(),
                       r[prefix + "last_loss"].get<double>());
  };
  out += line("stowage", "stowage_");
  if (r.contains("pytorch_tokens_per_s")) {
    out += line("PyTorch", "pytorch_");
    out += fmt::format("target: stowage tokens/s >= PyTorch's: {:.3f} x, {}\n",
                       r["stowage_over_pytorch_tokens_per_s"].get<double>(),
                       r["stowage_over_pytorch_tokens_per_s_met"].get<bool>() ? "met" : "NOT met");
  }
  if (r.contains("dip_window")) out += dip_text(r);
  if (r.contains("dip_unmeasured"))
    out += fmt::format("dip: not measured: {}\n", r["dip_unmeasured"].get<std::string>());
  return out;
}

}  // namespace

void add_bench_train(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "train",
      "Tokens per second and the dip after each checkpoint of `stowage train` (plain AdamW), and with --peer of the "
      "same training in PyTorch");
  auto o = std::make_shared<TrainBenchOptions>();
  cmd->add_option("--steps", o->train.steps, "training steps of each run")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--ckpt-every", o->train.ckpt_every,
                  "asynchronous checkpoint every K steps, and at the last (0: none)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--threads", o->train.threads, "intra-op threads of each side")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "runs of each side, taking turns")
      ->check(integer_in(1, 100))
      ->capture_default_str();
  cmd->add_option("--nproc", o->train.nproc, "ranks of each side (data-parallel over Gloo)")
      ->check(integer_in(1, 2))
      ->capture_default_str();
  cmd->add_option("--dip-window", o->dip_window,
                  "steps after each checkpoint whose slow-down against the steps far from any is the dip")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--corpus", o->train.corpus, "text file or directory of text files")->capture_default_str();
  cmd->add_option("--dir", o->dir, "scratch directory for the runs' checkpoints (default: the system temp directory)");
  cmd->add_flag("--peer", o->peer,
                "also train the same model in PyTorch (the torch wheel's Python), checkpointing with dcp.async_save");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] {
    if (o->peer && !bench::python_peer_available()) throw Error(bench::python_peer_unavailable_reason());
    const nlohmann::json result = run_train_bench(*o);
    bench::print_result(result, train_bench_text(result), o->json);
  });
}

}  // namespace stowage::cli
