// AdamW whose moments live in host buffers between steps and are swapped onto the
// device in a pipelined schedule during step(); the updates equal plain AdamW's.
#include <stowage/stowage.h>
#include <torch/torch.h>

int main() {
  torch::manual_seed(0);
  auto make_model = [] { return torch::nn::Sequential(torch::nn::Linear(256, 256), torch::nn::Linear(256, 256)); };
  auto model = make_model();
  auto twin = make_model();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) twin->parameters()[i].copy_(model->parameters()[i]);
  }

  auto swapped = stowage::optim::swap_optimizer(std::make_shared<torch::optim::AdamW>(model->parameters()),
                                                stowage::optim::SwapOptimizerConfig().swap_times(2));
  torch::optim::AdamW plain(twin->parameters());
  for (int step = 0; step < 5; ++step) {
    const auto x = torch::randn({32, 256});
    swapped->zero_grad();
    plain.zero_grad();
    model->forward(x).square().mean().backward();
    twin->forward(x).square().mean().backward();
    swapped->step();
    plain.step();
  }
  const auto copies = swapped->copy_stats();
  const bool same = torch::equal(model->parameters()[0], twin->parameters()[0]);
  std::printf("after 5 steps: parameters %s plain AdamW's; %lld uploads, %lld downloads\n",
              same ? "equal" : "DIFFER from", static_cast<long long>(copies.h2d_copies),
              static_cast<long long>(copies.d2h_copies));
  return same ? 0 : 1;
}
