#include "protocol_bench.h"

#include "bench_util.h"

#include <stowage/memory/accounting.h>
#include <stowage/train/trainer.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

namespace stowage::bench {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct NullSink final : train::EventSink {
  void step(const train::StepRecord&) override {}
  void checkpoint(const dcp::SaveReport&) override {}
  void end(const train::RunSummary&) override {}
  void message(const std::string&) override {}
  void warning(const std::string&) override {}
};

torch::nn::Sequential make_model(int64_t width) {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::ReLU(), torch::nn::Linear(width, width));
}

std::shared_ptr<torch::optim::Optimizer> make_adamw(std::vector<torch::Tensor> params) {
  return std::make_shared<torch::optim::AdamW>(std::move(params), torch::optim::AdamWOptions(1e-3));
}

// Each step's time, in microseconds, of a loop that calls `step(i)`.
template <typename Step>
std::vector<double> time_steps(int64_t steps, Step&& step) {
  std::vector<double> times;
  for (int64_t i = 1; i <= steps; ++i) {
    const auto start = Clock::now();
    step(i);
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return times;
}

std::vector<double> plain_round(const ProtocolBenchOptions& o) {
  torch::nn::Sequential model = make_model(o.width);
  const auto optimizer = make_adamw(model->parameters());
  const torch::Tensor x = torch::randn({o.batch, o.width});
  return time_steps(o.steps, [&](int64_t) {
    optimizer->zero_grad();
    model->forward(x).square().mean().backward();
    optimizer->step();
  });
}

std::vector<double> trainer_round(const ProtocolBenchOptions& o, const std::string& run_dir) {
  fs::remove_all(run_dir);
  train::Trainer trainer(train::TrainerOptions(run_dir).steps(o.steps).events(
      [](const std::string&) { return std::make_shared<NullSink>(); }));
  torch::nn::Sequential model = make_model(o.width);
  trainer.prepare(model.ptr(), make_adamw, at::make_generator<at::CPUGeneratorImpl>(0));
  trainer.restore();
  const torch::Tensor x = torch::randn({o.batch, o.width});
  auto times = time_steps(o.steps, [&](int64_t step) {
    trainer.begin_step();
    const torch::Tensor loss = model->forward(x).square().mean();
    loss.backward();
    trainer.end_step(step, loss.item<double>());
  });
  trainer.finish();
  fs::remove_all(run_dir);
  return times;
}

}  // namespace

ProtocolBenchResult run_protocol_bench(const ProtocolBenchOptions& options) {
  const std::string run_dir = (fs::temp_directory_path() / fmt::format("stowage-protocol-{}", getpid())).string();
  memory::enable_accounting();  // a Trainer turns it on for the process: both loops run with it
  std::vector<double> plain, trainer;
  for (int64_t round = 0; round < options.rounds; ++round) {
    const std::vector<double> p = plain_round(options), t = trainer_round(options, run_dir);
    plain.insert(plain.end(), p.begin(), p.end());
    trainer.insert(trainer.end(), t.begin(), t.end());
  }
  return {options, median(plain), median(trainer)};
}

nlohmann::json to_json(const ProtocolBenchResult& r) {
  return {{"steps", r.options.steps},  {"rounds", r.options.rounds},       {"width", r.options.width},
          {"batch", r.options.batch},  {"plain_step_us", r.plain_step_us}, {"trainer_step_us", r.trainer_step_us},
          {"protocol_us", r.cost_us()}};
}

std::string to_text(const ProtocolBenchResult& r) {
  return fmt::format(
      "a step of a {}x{} MLP (batch {}), median of {} rounds x {} steps: its own loop {:.1f} us, through "
      "train::Trainer {:.1f} us: the protocol costs {:.1f} us a step (checkpoints off)\n",
      r.options.width, r.options.width, r.options.batch, r.options.rounds, r.options.steps, r.plain_step_us,
      r.trainer_step_us, r.cost_us());
}

}  // namespace stowage::bench
