#pragma once

// The swap optimizer's calls that move its states between host and device or can fail a
// step on their own, behind one seam: the copies (it is the copy engine's
// memory::CopyEnv) and the point before each parameter's update. Its disk tier's file
// calls go through the file system's seam instead, the dcp::Env checkpoints use
// (SwapOptimizerConfig::file_env). SwapOptimizerConfig::env injects one; null means
// SwapEnv::standard(), the real calls. Tests derive from it to fail any of them
// (tests/optim/fault_injection_swap_env.h).
//
// Failure semantics, for every implementation: a copy that fails throws, after writing
// what it likes to its destination; before_update throws to fail that parameter's update
// before it changes anything, as an allocation failure would. The env is called from the
// optimizer's thread and its copy lanes, and must outlive the optimizer.

#include <stowage/memory/copy_engine.h>

#include <cstdint>

namespace stowage::optim {

class SwapEnv : public memory::CopyEnv {
 public:
  // The real calls; never destroyed.
  static SwapEnv* standard();

  // Before the update of the parameter numbered `param_index` across groups. The real
  // one does nothing.
  virtual void before_update(int64_t param_index);
};

}  // namespace stowage::optim
