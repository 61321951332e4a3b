#pragma once

// Env::posix()'s BatchIo (dcp/env.h): io_uring (liburing) with several blocks in flight, or
// a pool of threads calling pread/pwrite where io_uring is not to be had.

#include <stowage/dcp/env.h>

#include <memory>

namespace stowage::dcp::detail {

std::unique_ptr<BatchIo> make_posix_batch_io(BatchIoPath path);

}  // namespace stowage::dcp::detail
