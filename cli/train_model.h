#pragma once

// The model `stowage train` trains: a small decoder-only transformer language model
// over bytes (vocabulary 256), built from LibTorch modules.

#include <stowage/activation/policy.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

namespace stowage::cli {

struct LanguageModelOptions {
  int64_t vocab = 256;
  int64_t context = 64;  // longest sequence the position embedding covers
  int64_t layers = 4;
  int64_t width = 128;
  int64_t heads = 4;
};

// Pre-norm block: x + attention(norm(x)), then x + mlp(norm(x)). Causal attention. Its
// attention core (scores, softmax, weighted values: the activations quadratic in the
// sequence length) and its MLP run through CheckpointSites, "attention_core" and "mlp",
// which activation::apply_activation_checkpointing can enable (selective recompute).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t width, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  int64_t heads_;
  torch::nn::LayerNorm attention_norm_{nullptr}, mlp_norm_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attention_out_{nullptr}, mlp_in_{nullptr}, mlp_out_{nullptr};
  activation::CheckpointSite attention_core_{nullptr}, mlp_{nullptr};
};
TORCH_MODULE(Block);

class LanguageModelImpl : public torch::nn::Module {
 public:
  explicit LanguageModelImpl(const LanguageModelOptions& options);
  // tokens: [batch, time] int64 -> logits [batch, time, vocab]. `run_blocks` runs the
  // block stack (so that the caller can checkpoint it); by default it is run plainly.
  torch::Tensor forward(
      const torch::Tensor& tokens,
      const std::function<torch::Tensor(torch::nn::Sequential&, const torch::Tensor&)>& run_blocks = {});
  torch::nn::Sequential& blocks() { return blocks_; }

 private:
  LanguageModelOptions options_;
  torch::nn::Embedding token_embedding_{nullptr}, position_embedding_{nullptr};
  torch::nn::Sequential blocks_{nullptr};
  torch::nn::LayerNorm final_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(LanguageModel);

}  // namespace stowage::cli
