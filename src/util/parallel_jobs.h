#pragma once

// Independent jobs spread over threads of stowage's own (a save's file writers, a load's
// chunk readers).

#include <atomic>
#include <cstddef>
#include <functional>

namespace stowage::util {

// Runs run(i, failed) for each job i in [0, count), each once, on `threads` threads: the
// caller's and threads - 1 it starts, each of which first runs ATen serially
// (intra_op_threads.h). Once a job has thrown, `failed` is true, no job starts, and the
// first exception is rethrown after every thread is done; a long job may read `failed` to
// stop early.
// REQUIRES: threads >= 1.
void run_parallel_jobs(size_t count, size_t threads,
                       const std::function<void(size_t job, const std::atomic<bool>& failed)>& run);

}  // namespace stowage::util
