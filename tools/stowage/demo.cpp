#include "commands.h"

#include <stowage/stowage.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace stowage::cli {
namespace {

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::GELU(), torch::nn::Linear(64, 1));
}

void train(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps, int64_t seed) {
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    const auto x = torch::randn({64, 32});
    const auto y = x.sum(1, /*keepdim=*/true).sin();
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
  }
}

// Trains, snapshots model and optimizer through their state dicts, restores both into
// fresh objects, continues, and checks the result is bit-identical to an uninterrupted run.
void run_demo(int steps) {
  memory::enable_accounting();
  torch::manual_seed(0);
  auto model = make_model();
  auto optimizer = std::make_shared<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-2));
  train(model, *optimizer, steps, 1);
  ModuleState model_state(model.ptr());
  OptimizerState optimizer_state(optimizer);
  StateDict snapshot;
  snapshot.insert("model", model_state.state_dict());
  snapshot.insert("optim", optimizer_state.state_dict());
  StateDict staged = create_cpu_state_dict(snapshot);
  copy_state_dict(snapshot, staged);
  fmt::print("trained {} steps; snapshot holds {} entries, {} bytes allocated by LibTorch now (peak {})\n", steps,
             flatten_state_dict(staged).size(), memory::memory_allocated(), memory::max_memory_allocated());

  train(model, *optimizer, steps, 2);

  torch::manual_seed(42);
  auto resumed = make_model();
  auto resumed_optimizer =
      std::make_shared<torch::optim::AdamW>(resumed->parameters(), torch::optim::AdamWOptions(1e-2));
  ModuleState(resumed.ptr()).load_state_dict(staged.at("model").toGenericDict());
  OptimizerState(resumed_optimizer).load_state_dict(staged.at("optim").toGenericDict());
  train(resumed, *resumed_optimizer, steps, 2);

  bool identical = true;
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    identical = identical && torch::equal(model->parameters()[i], resumed->parameters()[i]);
  }
  fmt::print("resumed run after {} more steps is {} the uninterrupted run\n", steps,
             identical ? "bit-identical to" : "DIFFERENT from");
  if (!identical) {
    throw Error("demo: the resumed run diverged");
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* demo = app.add_subcommand("demo", "Train a tiny model, snapshot and restore it, check exact resume");
  auto steps = std::make_shared<int>(20);
  demo->add_option("--steps", *steps, "training steps before and after the snapshot")->check(CLI::PositiveNumber);
  demo->callback([steps] { run_demo(*steps); });
}

}  // namespace stowage::cli
