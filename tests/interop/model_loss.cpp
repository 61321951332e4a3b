// interop_model_loss CHECKPOINT TOKENS_FILE BATCH SEQ_LEN: the loss `stowage train`'s
// model (default architecture, context SEQ_LEN) gives on a batch, with its weights
// loaded from a checkpoint, stowage's (as `stowage train` saves it) or PyTorch DCP's. The batch is the file's first
// BATCH * (SEQ_LEN + 1) bytes, one sequence after another; each sequence's first SEQ_LEN
// bytes are the inputs and its last SEQ_LEN the targets, as in training. Prints the mean
// cross-entropy with 9 significant digits (python/tests/test_train_interop.py computes
// the same in PyTorch from an export of the weights).
#include <stowage/stowage.h>

#include "train_model.h"

#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s CHECKPOINT TOKENS_FILE BATCH SEQ_LEN\n", argv[0]);
    return 2;
  }
  const std::string checkpoint = argv[1];
  const int64_t batch = std::stoll(argv[3]);
  const int64_t seq_len = std::stoll(argv[4]);
  std::ifstream in(argv[2], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (static_cast<int64_t>(bytes.size()) < batch * (seq_len + 1)) {
    std::fprintf(stderr, "%s holds %zu bytes, fewer than the batch needs\n", argv[2], bytes.size());
    return 2;
  }
  torch::Tensor tokens = torch::empty({batch, seq_len + 1}, torch::kLong);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.view(-1)[i] = static_cast<unsigned char>(bytes[i]);

  stowage::cli::LanguageModelOptions options;
  options.context = seq_len;
  stowage::cli::LanguageModel model(options);
  stowage::StateDict state;
  state.insert("model", stowage::as_ivalue(model.ptr()));
  const std::unique_ptr<stowage::dcp::StorageReader> reader = stowage::dcp::open_checkpoint(checkpoint);
  stowage::dcp::load(state, *reader);  // the model's entries; the others stay unread

  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model->forward(tokens.narrow(1, 0, seq_len));
  const torch::Tensor loss =
      torch::cross_entropy_loss(logits.reshape({-1, options.vocab}), tokens.narrow(1, 1, seq_len).reshape({-1}));
  std::printf("%.9g\n", loss.item<double>());
  return 0;
}
