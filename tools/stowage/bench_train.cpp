// `stowage bench train`: the tokens per second of `stowage train` (its default model,
// data, batch and activation checkpointing, plain AdamW, an asynchronous checkpoint
// every K steps), run as the real command in a child process; with --peer, against the
// same training in PyTorch (bench/peer/train_peer.py: the same model, the same batches,
// checkpoint_sequential, torch.optim.AdamW, dcp.async_save with a DefaultStager), the
// two taking turns round by round.
#include "child_process.h"
#include "cli_numbers.h"
#include "commands.h"
#include "train_data.h"

#include <bench_util.h>
#include <python_peer.h>

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <regex>
#include <utility>

namespace stowage::cli {
namespace {

// The run both sides train: `stowage train`'s defaults (train.cpp's TrainOptions), given
// to both explicitly so that they train the same thing whatever those defaults become.
struct TrainBenchOptions {
  std::string corpus = kDefaultCorpusDir;
  int64_t steps = 200;
  int64_t batch = 16;
  int64_t seq_len = 64;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  double lr = 3e-3;
  int64_t seed = 0;
  int threads = 2;
  int64_t recompute_segments = 2;
  int64_t ckpt_every = 50;
  int64_t keep = 3;
  int rounds = 3;
  std::string dir;  // scratch space; empty: the system temp directory
  bool peer = false;
  bool json = false;
};

// One training run's time over its steps (from before the first to after the last
// checkpoint committed) and its first and last losses.
struct TrainRun {
  double seconds = 0;
  double first_loss = 0;
  double last_loss = 0;
};

// Runs `args` with stdout and stderr into `log`; returns what it printed. Throws
// stowage::Error with its last lines when it fails.
std::string run_logged(const std::vector<std::string>& args, const std::string& log) {
  const ChildRun run = run_child(args, log);
  if (!run.succeeded()) {
    const std::string& text = run.output;
    throw Error(fmt::format("bench train: `stowage train` failed (status {}): {}", run.status,
                            text.substr(text.size() > 2000 ? text.size() - 2000 : 0)));
  }
  return run.output;
}

// The command line of `stowage train` for the run `o` describes, into `run_dir`.
std::vector<std::string> stowage_train_command(const TrainBenchOptions& o, const std::string& run_dir) {
  std::vector<std::string> command{executable_path(), "train", "--corpus", o.corpus,
                                   "--run-dir",       run_dir, "--lr",     fmt::format("{}", o.lr),
                                   "--swap-times",    "0"};
  const std::vector<std::pair<const char*, int64_t>> numbers{
      {"--steps", o.steps},
      {"--batch", o.batch},
      {"--seq-len", o.seq_len},
      {"--layers", o.layers},
      {"--width", o.width},
      {"--heads", o.heads},
      {"--seed", o.seed},
      {"--threads", o.threads},
      {"--recompute-segments", o.recompute_segments},
      {"--ckpt-every", o.ckpt_every},
      {"--keep", o.keep},
      {"--log-every", o.steps}};  // one progress line: the last step's
  for (const auto& [flag, value] : numbers) command.insert(command.end(), {flag, std::to_string(value)});
  return command;
}

// `stowage train` itself, plain AdamW (--swap-times 0) as the PyTorch script's, in a new
// run directory. Its time is the one its last line reports ("done: steps 1-N in X s,
// loss A -> B"): the loop, without the process's start-up and the model's construction.
TrainRun run_stowage_train(const TrainBenchOptions& o, const bench::Scratch& scratch) {
  const std::string run_dir = scratch.sub("stowage-run");
  std::filesystem::remove_all(run_dir);
  const std::string output = run_logged(stowage_train_command(o, run_dir), scratch.sub("stowage-train.log"));
  std::filesystem::remove_all(run_dir);
  static const std::regex done(R"(done: steps 1-(\d+) in ([0-9.]+) s, loss ([0-9.naif-]+) -> ([0-9.naif-]+))");
  std::smatch match;
  if (!std::regex_search(output, match, done) || std::stoll(match[1]) != o.steps) {
    throw Error(fmt::format("bench train: `stowage train` did not report its {} steps: {}", o.steps, output));
  }
  const double seconds = std::stod(match[2]);
  if (seconds <= 0) {
    throw Error(fmt::format("bench train: {} steps took `stowage train` under the 0.1 s it reports: give more --steps",
                            o.steps));
  }
  return {seconds, std::stod(match[3]), std::stod(match[4])};
}

TrainRun run_pytorch_train(const TrainBenchOptions& o, const bench::Scratch& scratch, bench::PythonPeer& peer) {
  const std::string run_dir = scratch.sub("pytorch-run");
  std::filesystem::remove_all(run_dir);
  const nlohmann::json answer = peer.request({{"op", "train"},
                                              {"corpus", o.corpus},
                                              {"run_dir", run_dir},
                                              {"steps", o.steps},
                                              {"batch", o.batch},
                                              {"seq_len", o.seq_len},
                                              {"layers", o.layers},
                                              {"width", o.width},
                                              {"heads", o.heads},
                                              {"lr", o.lr},
                                              {"seed", o.seed},
                                              {"threads", o.threads},
                                              {"recompute_segments", o.recompute_segments},
                                              {"ckpt_every", o.ckpt_every},
                                              {"keep", o.keep}});
  for (const auto& path : answer.at("checkpoints")) {
    if (!std::filesystem::exists(path.get<std::string>() + "/.metadata")) {
      throw Error(fmt::format("bench train: the PyTorch script's checkpoint {} has no .metadata", path.dump()));
    }
  }
  std::filesystem::remove_all(run_dir);
  return {answer.at("seconds").get<double>(), answer.at("first_loss").get<double>(),
          answer.at("last_loss").get<double>()};
}

// The medians of the rounds' figures, as "<prefix>tokens_per_s" and the like.
void add_runs(nlohmann::json& out, const std::string& prefix, const std::vector<TrainRun>& runs, int64_t tokens) {
  std::vector<double> seconds;
  seconds.reserve(runs.size());
  for (const TrainRun& run : runs) seconds.push_back(run.seconds);
  const double median_s = bench::median(seconds);
  out[prefix + "seconds"] = median_s;
  out[prefix + "tokens_per_s"] = static_cast<double>(tokens) / median_s;
  out[prefix + "first_loss"] = runs.back().first_loss;
  out[prefix + "last_loss"] = runs.back().last_loss;
}

nlohmann::json run_train_bench(const TrainBenchOptions& o) {
  const bench::Scratch scratch(o.dir, "train");
  std::unique_ptr<bench::PythonPeer> peer;
  if (o.peer) peer = std::make_unique<bench::PythonPeer>("train_peer.py", std::vector<std::string>{});
  std::vector<TrainRun> stowage_runs, pytorch_runs;
  std::vector<std::function<void()>> turns{[&] { stowage_runs.push_back(run_stowage_train(o, scratch)); }};
  if (peer) turns.emplace_back([&] { pytorch_runs.push_back(run_pytorch_train(o, scratch, *peer)); });
  for (int round = 0; round < o.rounds; ++round) bench::run_round(round, turns);

  const int64_t tokens = o.steps * o.batch * o.seq_len;
  nlohmann::json out{{"steps", o.steps},
                     {"batch", o.batch},
                     {"seq_len", o.seq_len},
                     {"tokens", tokens},
                     {"threads", o.threads},
                     {"recompute_segments", o.recompute_segments},
                     {"ckpt_every", o.ckpt_every},
                     {"optimizer", "AdamW, plain (stowage train --swap-times 0)"},
                     {"rounds", o.rounds},
                     {"time_measured",
                      "the training loop, from before the first step until the last checkpoint "
                      "committed; median of the rounds"}};
  add_runs(out, "stowage_", stowage_runs, tokens);
  if (!peer) return out;
  add_runs(out, "pytorch_", pytorch_runs, tokens);
  const double ratio = out["stowage_tokens_per_s"].get<double>() / out["pytorch_tokens_per_s"].get<double>();
  out["stowage_over_pytorch_tokens_per_s"] = ratio;
  out["stowage_over_pytorch_tokens_per_s_met"] = ratio >= 1;
  return out;
}

std::string train_bench_text(const nlohmann::json& r) {
  std::string out = fmt::format(
      "train benchmark: {} steps of {} tokens, {} threads, {} checkpoint segments, a checkpoint every {} steps, "
      "{}\n",
      r["steps"].get<int64_t>(), r["batch"].get<int64_t>() * r["seq_len"].get<int64_t>(), r["threads"].get<int>(),
      r["recompute_segments"].get<int64_t>(), r["ckpt_every"].get<int64_t>(), r["optimizer"].get<std::string>());
  const auto line = [&r](const std::string& who, const std::string& prefix) {
    return fmt::format("  {:<8} {:8.0f} tok/s ({:.2f} s, median of {}), loss {:.3f} -> {:.3f}\n", who,
                       r[prefix + "tokens_per_s"].get<double>(), r[prefix + "seconds"].get<double>(),
                       r["rounds"].get<int>(), r[prefix + "first_loss"].get<double>(),
                       r[prefix + "last_loss"].get<double>());
  };
  out += line("stowage", "stowage_");
  if (!r.contains("pytorch_tokens_per_s")) return out;
  out += line("PyTorch", "pytorch_");
  out += fmt::format("target: stowage tokens/s >= PyTorch's: {:.3f} x, {}\n",
                     r["stowage_over_pytorch_tokens_per_s"].get<double>(),
                     r["stowage_over_pytorch_tokens_per_s_met"].get<bool>() ? "met" : "NOT met");
  return out;
}

}  // namespace

void add_bench_train(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "train", "Tokens per second of `stowage train` (plain AdamW), and with --peer of the same training in PyTorch");
  auto o = std::make_shared<TrainBenchOptions>();
  cmd->add_option("--steps", o->steps, "training steps of each run")
      ->check(positive_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--ckpt-every", o->ckpt_every, "asynchronous checkpoint every K steps, and at the last (0: none)")
      ->check(non_negative_integer<int64_t>())
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "intra-op threads of each side")
      ->check(positive_integer<int>())
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "runs of each side, taking turns")
      ->check(integer_in(1, 100))
      ->capture_default_str();
  cmd->add_option("--corpus", o->corpus, "text file or directory of text files")->capture_default_str();
  cmd->add_option("--dir", o->dir, "scratch directory for the runs' checkpoints (default: the system temp directory)");
  cmd->add_flag("--peer", o->peer,
                "also train the same model in PyTorch (the torch wheel's Python), checkpointing with dcp.async_save");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] {
    if (o->peer && !bench::python_peer_available()) throw Error(bench::python_peer_unavailable_reason());
    const nlohmann::json result = run_train_bench(*o);
    std::cout << (o->json ? result.dump() + "\n" : train_bench_text(result));
  });
}

}  // namespace stowage::cli
