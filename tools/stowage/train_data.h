#pragma once

// The text `stowage train` learns from, and the batches it draws from it.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace stowage::cli {

class Corpus {
 public:
  // Reads `path` (a file, or every regular file of a directory in name order).
  // Throws stowage::InvalidArgument naming the path when unreadable or too short.
  static Corpus load(const std::string& path, int64_t min_bytes);

  const std::string& source() const { return source_; }
  int64_t size() const { return bytes_.numel(); }

  // `batch` windows of `time + 1` bytes at offsets drawn from `generator`: inputs are
  // the first `time` bytes, targets the last `time`. Deterministic given the
  // generator's state, which is how a resumed run continues the same data stream.
  std::pair<at::Tensor, at::Tensor> sample(int64_t batch, int64_t time, at::Generator& generator) const;

 private:
  std::string source_;
  at::Tensor bytes_;  // int64 [size]
};

}  // namespace stowage::cli
