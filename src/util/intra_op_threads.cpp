#include "util/intra_op_threads.h"

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>

// Looked up in the libraries ATen loaded, never linked by stowage: weak, so that stowage
// brings no OpenMP runtime or BLAS of its own and loads beside a LibTorch without either.
// OpenMP: the calling thread's team size (libgomp, or the runtime a LibTorch wheel ships).
extern "C" void omp_set_num_threads(int) __attribute__((weak));
// OpenBLAS: 0 built serially, 1 with pthreads, 2 with OpenMP.
extern "C" int openblas_get_parallel() __attribute__((weak));

namespace stowage::util {

void run_aten_serially_on_this_thread() {
  // ATen sets a thread's team size at its first op, from the process-wide setting;
  // get_num_threads makes that happen now, so that it cannot undo ours later.
  if (at::get_num_threads() == 1 || omp_set_num_threads == nullptr) return;
  omp_set_num_threads(1);
}

void parallel_over_elements(const at::Tensor& tensor, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  TORCH_INTERNAL_ASSERT(tensor.is_contiguous(), "parallel_over_elements: a tensor that is not contiguous");
  if (tensor.numel() == 0) return;
  // The tensor is the iterator's one operand; each range's first element says where the
  // range begins.
  const at::Tensor flat = tensor.view(-1);
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .add_output(flat)
                                .set_check_mem_overlap(false)
                                .check_all_same_dtype(false)
                                .resize_outputs(false)
                                .build();
  const char* base = static_cast<const char*>(flat.data_ptr());
  const int64_t item_size = static_cast<int64_t>(flat.element_size());
  iter.for_each(
      [&](char** data, const int64_t* /*strides*/, int64_t size0, int64_t size1) {
        TORCH_INTERNAL_ASSERT(size1 == 1, "parallel_over_elements: a one-dimensional iterator gave rows");
        const int64_t begin = (data[0] - base) / item_size;
        fn(begin, begin + size0);
      },
      grain);
}

std::string blas_thread_conflict() {
  constexpr int kOpenBlasPthreads = 1;
  if (openblas_get_parallel == nullptr || openblas_get_parallel() != kOpenBlasPthreads) return {};
  if (at::get_parallel_info().find("OpenMP") == std::string::npos || at::get_num_threads() == 1) return {};
  return "the BLAS in this process is OpenBLAS built with pthreads, whose threads compete with ATen's OpenMP "
         "threads for the cores (a step of `stowage train` ran 2.5-4x slower, issue 37): use OpenBLAS's OpenMP "
         "build (Debian: libopenblas0-openmp, selected with update-alternatives; scripts/setup.sh does both)";
}

}  // namespace stowage::util
