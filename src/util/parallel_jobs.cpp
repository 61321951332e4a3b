#include "util/parallel_jobs.h"

#include "util/intra_op_threads.h"

#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace stowage::util {

void run_parallel_jobs(size_t count, size_t threads,
                       const std::function<void(size_t job, const std::atomic<bool>& failed)>& run) {
  TORCH_INTERNAL_ASSERT(threads >= 1, "run_parallel_jobs: no thread to run on");
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  const auto worker = [&] {
    for (size_t job = next++; job < count && !failed.load(); job = next++) {
      try {
        run(job, failed);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) {
    helpers.emplace_back([&worker] {
      run_aten_serially_on_this_thread();
      worker();
    });
  }
  worker();
  for (std::thread& helper : helpers) helper.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace stowage::util
