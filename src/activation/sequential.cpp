#include <stowage/activation/sequential.h>

#include "activation/module_buffers.h"
#include "activation/offload.h"

#include <fmt/format.h>

namespace stowage::activation {
namespace {

// Runs modules [begin, end) in order. Holds copies of the AnyModule handles, which
// share the modules, so a checkpoint can replay it after the caller's list is gone.
class ModuleRun {
 public:
  ModuleRun(const std::vector<torch::nn::AnyModule>& modules, size_t begin, size_t end)
      : modules_(modules.begin() + static_cast<std::ptrdiff_t>(begin),
                 modules.begin() + static_cast<std::ptrdiff_t>(end)) {}

  at::Tensor operator()(const at::Tensor& input) {
    at::Tensor x = input;
    for (torch::nn::AnyModule& module : modules_) {
      x = module.forward(x);
    }
    return x;
  }

 private:
  std::vector<torch::nn::AnyModule> modules_;
};

// `options` with the buffers of modules [begin, end) added.
CheckpointOptions with_buffers_of(const std::vector<torch::nn::AnyModule>& modules, int64_t begin, int64_t end,
                                  CheckpointOptions options) {
  for (int64_t i = begin; i < end; ++i) {
    options = activation::with_buffers_of(*modules[static_cast<size_t>(i)].ptr(), std::move(options));
  }
  return options;
}

}  // namespace

at::Tensor checkpoint_sequential(const std::vector<torch::nn::AnyModule>& modules, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options) {
  const auto size = static_cast<int64_t>(modules.size());
  if (segments < 1) {
    throw InvalidArgument(fmt::format("checkpoint_sequential: segments must be at least 1, got {}", segments));
  }
  if (segments > size) {
    throw InvalidArgument(fmt::format(
        "checkpoint_sequential: segments ({}) exceeds the number of modules ({}); each segment needs at least one "
        "module",
        segments, size));
  }
  if (!input.defined()) {
    throw InvalidArgument("checkpoint_sequential: the input tensor is undefined");
  }
  const int64_t per_segment = size / segments;
  const int64_t last_start = per_segment * (segments - 1);
  at::Tensor x = input;
  OffloadChain chain;  // with offload_inputs, each segment prefetches the one before it in backward
  for (int64_t start = 0; start < last_start; start += per_segment) {
    ModuleRun run(modules, start, start + per_segment);
    x = checkpoint_in_chain(
            [run](const std::vector<c10::IValue>& in) mutable -> std::vector<c10::IValue> {
              return {run(in[0].toTensor())};
            },
            {x}, with_buffers_of(modules, start, start + per_segment, options), &chain)[0]
            .toTensor();
  }
  return ModuleRun(modules, last_start, size)(x);
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, int64_t segments, const at::Tensor& input,
                                 const CheckpointOptions& options) {
  return checkpoint_sequential(std::vector<torch::nn::AnyModule>(sequential->begin(), sequential->end()), segments,
                               input, options);
}

}  // namespace stowage::activation
