#include "train_model.h"

#include <torch/torch.h>

#include <cmath>

namespace stowage::cli {

BlockImpl::BlockImpl(int64_t width, int64_t heads) : heads_(heads) {
  TORCH_CHECK(width % heads == 0, "model width ", width, " is not a multiple of the head count ", heads);
  attention_norm_ = register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  qkv_ = register_module("qkv", torch::nn::Linear(width, 3 * width));
  attention_out_ = register_module("attention_out", torch::nn::Linear(width, width));
  mlp_norm_ = register_module("mlp_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  mlp_in_ = register_module("mlp_in", torch::nn::Linear(width, 4 * width));
  mlp_out_ = register_module("mlp_out", torch::nn::Linear(4 * width, width));
  attention_core_ = register_module("attention_core", activation::CheckpointSite());
  mlp_ = register_module("mlp", activation::CheckpointSite());
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  const int64_t head_width = width / heads_;
  auto qkv = qkv_->forward(attention_norm_->forward(x)).view({batch, time, 3, heads_, head_width});
  auto q = qkv.select(2, 0).transpose(1, 2);  // [batch, heads, time, head_width]
  auto k = qkv.select(2, 1).transpose(1, 2);
  auto v = qkv.select(2, 2).transpose(1, 2);
  const auto core = [head_width, time](const std::vector<c10::IValue>& in) -> std::vector<c10::IValue> {
    const auto& q = in[0].toTensor();
    auto scores = torch::matmul(q, in[1].toTensor().transpose(-2, -1)) / std::sqrt(static_cast<double>(head_width));
    const auto causal =
        torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    return {torch::matmul(torch::softmax(scores, -1), in[2].toTensor())};
  };
  auto attended = attention_core_->forward(core, {q, k, v})[0].toTensor().transpose(1, 2).reshape({batch, time, width});
  auto h = x + attention_out_->forward(attended);
  return h +
         mlp_->forward([this](const torch::Tensor& in) { return mlp_out_->forward(torch::gelu(mlp_in_->forward(in))); },
                       mlp_norm_->forward(h));
}

LanguageModelImpl::LanguageModelImpl(const LanguageModelOptions& options) : options_(options) {
  token_embedding_ = register_module("token_embedding", torch::nn::Embedding(options.vocab, options.width));
  position_embedding_ = register_module("position_embedding", torch::nn::Embedding(options.context, options.width));
  blocks_ = register_module("blocks", torch::nn::Sequential());
  for (int64_t i = 0; i < options.layers; ++i) {
    blocks_->push_back(Block(options.width, options.heads));
  }
  final_norm_ = register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.width})));
  head_ = register_module("head", torch::nn::Linear(options.width, options.vocab));
}

torch::Tensor LanguageModelImpl::forward(
    const torch::Tensor& tokens,
    const std::function<torch::Tensor(torch::nn::Sequential&, const torch::Tensor&)>& run_blocks) {
  const int64_t time = tokens.size(1);
  TORCH_CHECK(time <= options_.context, "sequence of ", time, " tokens exceeds the model's context of ",
              options_.context);
  auto positions = torch::arange(time, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto x = token_embedding_->forward(tokens) + position_embedding_->forward(positions);
  x = run_blocks ? run_blocks(blocks_, x) : blocks_->forward(x);
  return head_->forward(final_norm_->forward(x));
}

}  // namespace stowage::cli
