#include "train_data.h"

#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace stowage::cli {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(fmt::format("cannot read corpus file '{}'", path.string()));
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

Corpus Corpus::load(const std::string& path, int64_t min_bytes) {
  std::error_code error;
  std::string text;
  if (fs::is_directory(path, error)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) text += read_file(file);
  } else {
    text = read_file(path);
  }
  if (static_cast<int64_t>(text.size()) < min_bytes) {
    throw InvalidArgument(
        fmt::format("corpus '{}' has {} bytes; training needs at least {}", path, text.size(), min_bytes));
  }
  Corpus corpus;
  corpus.source_ = path;
  auto bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
  corpus.bytes_ = bytes.to(at::kLong);
  return corpus;
}

std::pair<at::Tensor, at::Tensor> Corpus::sample(int64_t batch, int64_t time, at::Generator& generator) const {
  const auto starts = at::randint(0, size() - time - 1, {batch, 1}, generator, at::TensorOptions().dtype(at::kLong));
  const auto index = starts + at::arange(time + 1, at::kLong).unsqueeze(0);
  const auto windows = bytes_.index_select(0, index.flatten()).view({batch, time + 1});
  return {windows.narrow(1, 0, time), windows.narrow(1, 1, time)};
}

}  // namespace stowage::cli
