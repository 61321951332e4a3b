#pragma once

// What a training loop needs to resume exactly, beyond its model and optimizer: the step
// it is on, the state of the generator that draws its data (the data position), that of
// LibTorch's default CPU generator (dropout and initialisation on the CPU), and that of
// the default generator of every device the loop runs on (dropout on a device draws from
// the device's generator, not the CPU's). A Stateful, to checkpoint beside the model and
// the optimizer (train::Trainer does all of this for a loop):
//
//   auto progress = c10::make_intrusive<stowage::TrainingProgress>(data_generator, {device});
//   state.insert("progress", stowage::as_ivalue(progress));
//   ... progress->set_step(step); checkpoints.save(step, state);
//   ... after a restore: progress->step() is the step saved, and every generator draws
//       what it would have drawn after it.
//
// Its state dict is {"step": int, "data_rng": uint8 tensor, "torch_rng": uint8 tensor,
// "device_rng_<type>": uint8 tensor for each device, e.g. "device_rng_cuda"}, the
// generators' get_state(), each a copy: saving never races the loop. The keys name the
// device's type, not its index, so that ranks on cuda:0 and cuda:1 save one replicated
// entry (their generators, seeded alike and drawn alike, hold the same state).

#include <stowage/state/stateful.h>

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage {

class TrainingProgress final : public Stateful {
 public:
  // `data`: the generator the loop draws its data with (a CPU generator); restored in
  // place, so the loop's own handle follows. `devices`: the devices the loop runs on,
  // whose default generators are kept too (CPU devices add nothing: the CPU generator is
  // always kept). Throws InvalidArgument for a data generator that is not a CPU one, or
  // two devices of one type (one device of a type per process, as torchrun's one GPU a
  // rank).
  explicit TrainingProgress(at::Generator data, const std::vector<c10::Device>& devices = {});

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  StateDict state_dict() override;
  // Throws InvalidArgument naming the entry when `state` lacks one, holds another type,
  // or a generator state of another size than this build's generators take (a checkpoint
  // of another LibTorch's generator).
  void check_load_state_dict(const StateDict& state) override;
  // Restores the step and every generator, after the checks above: on an exception
  // nothing changed. A state without a device's entry (saved before device generators
  // were kept, or on the CPU) leaves that generator as it is, with a warning: the run goes
  // on, but not bit-identically to an uninterrupted one.
  void load_state_dict(const StateDict& state) override;

 private:
  // A device's default generator and its entry's key.
  struct DeviceGenerator {
    std::string key;
    at::Generator generator;
  };

  int64_t step_ = 0;
  at::Generator data_;
  std::vector<DeviceGenerator> devices_;
};

}  // namespace stowage
