#include "activation/module_buffers.h"

namespace stowage::activation {

CheckpointOptions with_buffers_of(const torch::nn::Module& module, CheckpointOptions options) {
  if (options.keep_recomputed_buffer_updates()) return options;
  for (const at::Tensor& buffer : module.buffers(/*recurse=*/true)) options.buffers().push_back(buffer);
  return options;
}

}  // namespace stowage::activation
