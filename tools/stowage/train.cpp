// `stowage train`: trains the byte-level transformer LM of train_model.h on a text
// corpus, showing progress and writing metrics into the run directory.
#include "commands.h"
#include "train_data.h"
#include "train_model.h"
#include "train_progress.h"

#include <stowage/stowage.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;

struct TrainOptions {
  std::string corpus = kDefaultCorpusDir;
  std::string run_dir = "runs/default";
  int64_t steps = 300;
  int64_t batch = 16;
  int64_t seq_len = 64;
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
  double lr = 3e-3;
  uint64_t seed = 0;
  int threads = 2;
  int64_t log_every = 25;
};

void train(const TrainOptions& options) {
  torch::set_num_threads(options.threads);
  memory::enable_accounting();
  fs::create_directories(options.run_dir);
  const Corpus corpus = Corpus::load(options.corpus, options.seq_len + 2);

  torch::manual_seed(options.seed);
  LanguageModelOptions model_options;
  model_options.context = options.seq_len;
  model_options.layers = options.layers;
  model_options.width = options.width;
  model_options.heads = options.heads;
  LanguageModel model(model_options);
  auto optimizer = std::make_shared<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(options.lr));
  // The data stream's own generator: its state is the data position.
  at::Generator data_generator = at::make_generator<at::CPUGeneratorImpl>(options.seed + 1);

  Progress progress((fs::path(options.run_dir) / "metrics.jsonl").string(), isatty(STDOUT_FILENO) != 0,
                    options.log_every);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  progress.message(fmt::format("training a {}-layer byte-level transformer ({:.2f}M parameters) on '{}' ({} bytes)",
                               options.layers, parameters / 1e6, corpus.source(), corpus.size()));

  double first_loss = 0, last_loss = 0;
  const auto run_start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= options.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    auto [inputs, targets] = corpus.sample(options.batch, options.seq_len, data_generator);
    memory::reset_peak_memory_stats();
    const int64_t before = memory::memory_allocated();
    optimizer->zero_grad();
    auto logits = model->forward(inputs);
    auto loss = torch::cross_entropy_loss(logits.view({-1, model_options.vocab}), targets.reshape({-1}));
    loss.backward();
    const int64_t activation_peak = memory::max_memory_allocated() - before;
    optimizer->step();
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    last_loss = loss.item<double>();
    if (step == 1) first_loss = last_loss;

    StepReport report;
    report.step = step;
    report.total_steps = options.steps;
    report.loss = last_loss;
    report.step_s = step_s;
    report.tokens_per_s = static_cast<double>(options.batch * options.seq_len) / step_s;
    report.peak_activation_bytes = activation_peak;
    report.staging_bytes = memory::host_buffer_stats().current_bytes;
    progress.step(report);
  }
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  progress.message(fmt::format("done: {} steps in {:.1f} s, loss {:.3f} -> {:.3f}", options.steps, total_s,
                               first_loss, last_loss));
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto options = std::make_shared<TrainOptions>();
  auto* cmd = app.add_subcommand("train", "Train a byte-level transformer language model on a text corpus");
  cmd->add_option("--corpus", options->corpus, "text file or directory of text files")->capture_default_str();
  cmd->add_option("--run-dir", options->run_dir, "where metrics and checkpoints go")->capture_default_str();
  cmd->add_option("--steps", options->steps, "optimizer steps")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--batch", options->batch, "sequences per step")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seq-len", options->seq_len, "tokens per sequence")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--layers", options->layers, "transformer blocks")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--width", options->width, "model width")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--heads", options->heads, "attention heads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--lr", options->lr, "AdamW learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--seed", options->seed, "random seed")->capture_default_str();
  cmd->add_option("--threads", options->threads, "intra-op threads")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--log-every", options->log_every, "steps between log lines when not on a terminal")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([options] { train(*options); });
}

}  // namespace stowage::cli
