#pragma once

// What a training loop needs to resume exactly, beyond its model and optimizer: the step
// it is on, the state of the generator that draws its data (the data position), and that
// of LibTorch's default CPU generator (dropout, initialisation). A Stateful, to checkpoint
// beside the model and the optimizer:
//
//   auto progress = c10::make_intrusive<stowage::TrainingProgress>(data_generator);
//   state.insert("progress", stowage::as_ivalue(progress));
//   ... progress->set_step(step); checkpoints.save(step, state);
//   ... after a restore: progress->step() is the step saved, and both generators draw
//       what they would have drawn after it.
//
// Its state dict is {"step": int, "data_rng": uint8 tensor, "torch_rng": uint8 tensor},
// the generators' get_state(), each a copy: saving never races the loop.

#include <stowage/state/stateful.h>

#include <ATen/core/Generator.h>

#include <cstdint>

namespace stowage {

class TrainingProgress final : public Stateful {
 public:
  // `data`: the generator the loop draws its data with (a CPU generator); restored in
  // place, so the loop's own handle follows.
  explicit TrainingProgress(at::Generator data);

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  StateDict state_dict() override;
  // Throws InvalidArgument naming the entry when `state` lacks one, holds another type,
  // or a generator state of another size than this build's generators take (a checkpoint
  // of another LibTorch's generator).
  void check_load_state_dict(const StateDict& state) override;
  // Restores the step and both generators, after the checks above: on an exception
  // nothing changed.
  void load_state_dict(const StateDict& state) override;

 private:
  int64_t step_ = 0;
  at::Generator data_;
};

}  // namespace stowage
