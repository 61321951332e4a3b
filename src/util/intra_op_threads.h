#pragma once

// ATen's intra-op threads and the threads that compete with them for the cores.
//
// With ATen's OpenMP backend, libgomp's workers spin for a while after each parallel
// region so that the next one starts without a wake-up through the kernel; the training
// loop's many small ops depend on it. Two things undo it (issue 37):
// - an op that runs parallel_for on a second thread starts an OpenMP team of that thread's
//   own, whose workers live as long as the thread; libgomp then manages more threads than
//   there are CPUs and throttles the spinning of every team in the process, the training
//   thread's included, for as long as that thread lives: on PyTorch 2.11's wheel the steps
//   after the first checkpoint ran 1.7x slower to the end of the run;
// - a BLAS with a thread pool of its own (OpenBLAS built with pthreads) spins its threads
//   against OpenMP's on the same cores: on Debian's LibTorch 1.13 a step ran 2.5-4x slower.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>

namespace stowage::util {

// Makes the calling thread's ATen ops run on it alone (its OpenMP team size becomes 1), so
// that ATen's parallelism stays the training thread's. Under ATen's native thread pool (no
// team per thread) it changes nothing.
// REQUIRES: called on a thread stowage started (staging, writing, reading, gradient
// reduction), before its first ATen op; never on a thread of the user's.
void run_aten_serially_on_this_thread();

// Runs fn(begin, end) over the element ranges of [0, tensor.numel()) on ATen's intra-op
// threads, each range at least `grain` elements but the last. at::parallel_for can't do it
// from stowage's code: its OpenMP region is a template compiled into the caller, and
// stowage compiles without -fopenmp (it links no OpenMP runtime, above), where the region
// runs serially. TensorIterator's for_each runs the split inside LibTorch, on its runtime.
// REQUIRES: tensor is contiguous; fn may run on several threads at once, on disjoint
// ranges, and throws nothing.
void parallel_over_elements(const at::Tensor& tensor, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Why the process's BLAS competes with ATen's OpenMP threads for the cores, and what
// fixes it; empty when it does not (OpenBLAS built with OpenMP or serially, MKL, no
// OpenBLAS loaded).
std::string blas_thread_conflict();

}  // namespace stowage::util
