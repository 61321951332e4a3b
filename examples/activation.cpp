// Train a deep MLP with activation checkpointing: the first segments keep no
// activations and recompute them in backward; gradients equal the plain run's.
#include <stowage/stowage.h>
#include <torch/torch.h>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential mlp;
  for (int i = 0; i < 8; ++i) {
    mlp->push_back(torch::nn::Linear(128, 128));
    mlp->push_back(torch::nn::GELU());
  }
  const auto input = torch::randn({256, 128});

  stowage::memory::enable_accounting();
  auto peak_of = [&](bool checkpointed) {
    mlp->zero_grad();
    stowage::memory::reset_peak_memory_stats();
    const int64_t before = stowage::memory::memory_allocated();
    auto out =
        checkpointed ? stowage::activation::checkpoint_sequential(mlp, /*segments=*/4, input) : mlp->forward(input);
    out.square().mean().backward();
    return stowage::memory::max_memory_allocated() - before;
  };
  const int64_t plain_peak = peak_of(false);
  const auto plain_grad = mlp->parameters()[0].grad().clone();
  const int64_t checkpointed_peak = peak_of(true);
  const bool same = torch::equal(plain_grad, mlp->parameters()[0].grad());
  std::printf("peak during forward+backward: plain %lld bytes, checkpointed %lld bytes; gradients %s\n",
              static_cast<long long>(plain_peak), static_cast<long long>(checkpointed_peak),
              same ? "identical" : "DIFFERENT");
  return same && checkpointed_peak < plain_peak ? 0 : 1;
}
