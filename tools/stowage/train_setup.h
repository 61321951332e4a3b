#pragma once

// What `stowage train` sets up around its model beyond what a train::Trainer does: the
// model, the checks that need it, the activation checkpointing its flags pick, and the
// line that describes the run.

#include "train_data.h"
#include "train_model.h"
#include "train_options.h"

#include <stowage/train/trainer.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace stowage::cli {

// What shapes the model and the data: a resume must keep it (train/run_directory.h).
train::RunConfig run_config(const TrainOptions& options);

// The model of the options, initialised from --seed on the CPU.
LanguageModel make_model(const TrainOptions& options);

// The checks that need the model or the run directory (--swap-host-budget against what
// the disk tier needs; the run directory's, train/run_directory.h), made once, before any
// rank starts: throws InvalidArgument naming the flag.
void check_run(const TrainOptions& options);

// What configure_activation_checkpointing picked.
struct ActivationCheckpointing {
  std::string picked;               // "2 segments", "selective (mlp)", the budget's plan, or "off"
  int64_t budget_bytes = 0;         // --activation-budget's; 0: none
  int64_t measured_peak_bytes = 0;  // with a budget: the activation peak of a step of the plan, as measured

  // For the banner: `picked`, and with a budget "for a budget of ... (a step measured ...)".
  std::string describe() const;
};

// Applies --selective-recompute, or --activation-budget (planned on a batch of this
// rank's size drawn apart from the training data, whose stream stays as without a
// budget), to `model`; returns what was picked. --recompute-segments is applied in the
// forward (run_blocks).
// REQUIRES: before the Trainer's prepare() (the gradient reducer's hooks would make
// collectives of passes whose number each rank decides alone).
ActivationCheckpointing configure_activation_checkpointing(LanguageModel& model, const TrainOptions& options,
                                                           const Corpus& corpus, c10::Device device, int64_t ranks);

// Runs the block stack as --recompute-segments and --offload-checkpoint-inputs say.
torch::Tensor run_blocks(const TrainOptions& options, torch::nn::Sequential& blocks, const torch::Tensor& x);

// "training a 4-layer byte-level transformer (0.87M parameters) on ...".
std::string describe_run(const TrainOptions& options, LanguageModel& model, const Corpus& corpus,
                         const ActivationCheckpointing& activation_checkpointing, train::Trainer& trainer);

}  // namespace stowage::cli
