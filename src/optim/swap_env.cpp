#include "optim/swap_env.h"

namespace stowage::optim {

SwapEnv* SwapEnv::standard() {
  static SwapEnv* const env = new SwapEnv();
  return env;
}

std::shared_ptr<detail::SwapFile> SwapEnv::create_scratch_file(const std::string& dir, const std::string& stem,
                                                               int64_t bytes) {
  return detail::SwapFile::create(dir, stem, bytes);
}

void SwapEnv::transfer(detail::IoOp op, int64_t /*batch*/, detail::SwapFileIo& io,
                       const std::vector<detail::IoRequest>& requests) {
  io.run(op, requests);
}

void SwapEnv::before_update(int64_t /*param_index*/) {}

}  // namespace stowage::optim
