// The BLAS that the process loaded shares ATen's OpenMP threads (src/util/intra_op_threads.h):
// OpenBLAS built with pthreads spins threads of its own against them, and a step of
// `stowage train` on Debian's LibTorch ran 2.5-4x slower (issue 37). scripts/setup.sh
// chooses OpenBLAS's OpenMP build; this fails on a machine where it is not chosen.
#include "util/intra_op_threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

namespace stowage::util {
namespace {

TEST(BlasThreads, TheProcessBlasDoesNotCompeteWithAtensThreads) {
  const int previous = at::get_num_threads();
  at::set_num_threads(2);  // as `stowage train` by default: one thread alone competes with nobody
  EXPECT_EQ(blas_thread_conflict(), "");
  at::set_num_threads(previous);
}

}  // namespace
}  // namespace stowage::util
