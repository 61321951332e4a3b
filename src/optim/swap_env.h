#pragma once

// The swap optimizer's calls that move its states or can fail a step on their own, behind
// one seam (the role dcp::Env plays for checkpoints): the copies between host and device
// (it is the copy engine's memory::CopyEnv), the disk tier's scratch files and each
// batch's reads and writes, and the point before each parameter's update.
// SwapOptimizerConfig::env injects one; null means SwapEnv::standard(), the real calls.
// Tests derive from it to fail any of them (tests/optim/fault_injection_swap_env.h).
//
// Failure semantics, for every implementation: create_scratch_file and transfer throw
// stowage::IoError naming the file, the operation and the errno, as the real calls do; a
// failed transfer may have moved part of its requests first (as a write that runs out of
// space part way does). before_update throws to fail that parameter's update before it
// changes anything, as an allocation failure would. The env is called from the
// optimizer's thread, its copy lanes and its I/O thread, and must outlive the optimizer.

#include <stowage/memory/copy_engine.h>

#include "optim/swap_file.h"
#include "optim/swap_file_io.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace stowage::optim {

class SwapEnv : public memory::CopyEnv {
 public:
  // The real calls; never destroyed.
  static SwapEnv* standard();

  // A scratch file of `bytes` zeros in `dir` (SwapFile::create).
  virtual std::shared_ptr<detail::SwapFile> create_scratch_file(const std::string& dir, const std::string& stem,
                                                                int64_t bytes);
  // Batch `batch`'s reads or writes in one step (recovery may repeat a batch's write),
  // through `io`.
  virtual void transfer(detail::IoOp op, int64_t batch, detail::SwapFileIo& io,
                        const std::vector<detail::IoRequest>& requests);
  // Before the update of the parameter numbered `param_index` across groups. The real
  // one does nothing.
  virtual void before_update(int64_t param_index);
};

}  // namespace stowage::optim
