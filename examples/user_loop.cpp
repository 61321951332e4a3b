// A user's own model and training loop on stowage's train::Trainer: residual blocks of
// BatchNorm1d -> Linear -> GELU -> Dropout -> Linear, AdamW with its state swapped to host
// memory, checkpoints every 5 steps. Stopped by SIGTERM (it saves the step it is on and
// exits 75) and run again with --resume, it ends bit-identical to a run never stopped.
//   example_user_loop RUN_DIR [--device sim] [--steps 30] [--swap-times 4] [--resume]
// Under `stowage launch --nproc 2 -- example_user_loop ...` it trains data-parallel.
#include <stowage/stowage.h>
#if defined(STOWAGE_WITH_SIM)
#include <stowage/sim/sim.h>
#endif

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <iostream>
#include <string>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : norm(register_module("norm", torch::nn::BatchNorm1d(width))),
        up(register_module("up", torch::nn::Linear(width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.1))),
        down(register_module("down", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + down(drop(torch::gelu(up(norm(x))))); }
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear up;
  torch::nn::Dropout drop;
  torch::nn::Linear down;
};
TORCH_MODULE(Block);

// A hash of every parameter's and buffer's bytes: equal runs print equal states.
size_t state_hash(torch::nn::Module& model) {
  size_t hash = 0;
  for (const auto& tensors : {model.parameters(), model.buffers()}) {
    for (const auto& t : tensors) {
      const torch::Tensor cpu = t.detach().cpu().contiguous();
      const std::string bytes(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
      hash = hash * 31 + std::hash<std::string>{}(bytes);
    }
  }
  return hash;
}

int main(int argc, char** argv) try {
  if (argc < 2) throw stowage::InvalidArgument("usage: example_user_loop RUN_DIR [--device D] [--steps N] ...");
  std::string device = "cpu";
  int64_t steps = 30, swap_times = 4, width = 512, batch = 64;
  bool resume = false;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--resume") {
      resume = true;
    } else if (i + 1 < argc && flag == "--device") {
      device = argv[++i];
    } else if (i + 1 < argc && (flag == "--steps" || flag == "--swap-times")) {
      (flag == "--steps" ? steps : swap_times) = std::stoll(argv[++i]);
    } else {
      throw stowage::InvalidArgument("unknown argument '" + flag + "'");
    }
  }
#if defined(STOWAGE_WITH_SIM)
  if (device.rfind("sim", 0) == 0) stowage::sim::register_device();
#endif
  auto options = stowage::train::TrainerOptions(argv[1])
                     .steps(steps)
                     .device(c10::Device(device))
                     .resume(resume)
                     .checkpoints(stowage::dcp::CheckpointManagerOptions().save_every(5))
                     .config({{"width", std::to_string(width)}, {"batch", std::to_string(batch)}});
  if (swap_times > 0) options.swap(stowage::optim::SwapOptimizerConfig().swap_times(swap_times));
  stowage::train::Trainer trainer(options);

  torch::manual_seed(0);  // every rank initialises the same model
  torch::nn::Sequential model;
  for (int i = 0; i < 6; ++i) model->push_back(Block(width));
  model->to(trainer.device());
  auto data = at::make_generator<at::CPUGeneratorImpl>(1);  // every rank draws the global batch
  trainer.prepare(
      model.ptr(),
      [](std::vector<torch::Tensor> share) {
        return std::make_shared<torch::optim::AdamW>(std::move(share), torch::optim::AdamWOptions(1e-3));
      },
      data);
  const int64_t slice = batch / trainer.world().size, rank = trainer.world().rank;
  for (int64_t step = trainer.restore(); step <= steps; ++step) {
    const torch::Tensor x = at::randn({batch, width}, data).narrow(0, rank * slice, slice).to(trainer.device());
    trainer.begin_step();
    const torch::Tensor loss = torch::mse_loss(model->forward(x), torch::sin(x));
    loss.backward();
    if (!trainer.end_step(step, loss.item<double>())) break;
  }
  const int status = trainer.finish();
  if (rank == 0) std::cout << "step " << trainer.step() << " state " << state_hash(*model) << std::endl;
  return status;
} catch (const std::exception& e) {
  std::cerr << "example_user_loop: " << e.what() << std::endl;
  return 1;
}
