#include "dcp/memory_tier_pages.h"

#include "dcp/storage/file_io.h"

#include <stowage/dcp/checkpoint_directory.h>

#include <algorithm>
#include <filesystem>
#include <utility>

namespace stowage::dcp {
namespace fs = std::filesystem;

PageRecycler::PageRecycler(Env* target, std::string spare_directory)
    : EnvWrapper(target), spare_directory_(std::move(spare_directory)) {}

std::vector<std::string> PageRecycler::spare_files() {
  std::vector<std::pair<int64_t, std::string>> sized;
  if (target()->file_type(spare_directory_) == FileType::kDirectory) {
    for (const std::string& name : target()->list_directory(spare_directory_)) {
      const std::string path = (fs::path(spare_directory_) / name).string();
      if (target()->file_type(path) == FileType::kRegular) {
        sized.emplace_back(target()->open_for_reading(path)->size(), path);
      }
    }
  }
  std::sort(sized.rbegin(), sized.rend());
  std::vector<std::string> paths;
  paths.reserve(sized.size());
  for (auto& [size, path] : sized) paths.push_back(std::move(path));
  return paths;
}

std::unique_ptr<WritableFile> PageRecycler::create_file(const std::string& path) {
  // A path that exists goes to create_file, which refuses it: nothing is replaced.
  if (detail::is_data_file_name(fs::path(path).filename().string()) && target()->file_type(path) == FileType::kAbsent) {
    const std::vector<std::string> spares = spare_files();
    if (!spares.empty()) return target()->reuse_file(spares.front(), path);
  }
  return target()->create_file(path);
}

void PageRecycler::retire(const std::string& path) {
  if (target()->file_type(path) == FileType::kAbsent) return;
  uncommit_checkpoint(path, *target());
  target()->create_directories(spare_directory_);
  auto spare_count = static_cast<int64_t>(spare_files().size());
  for (const std::string& name : target()->list_directory(path)) {
    const std::string file = (fs::path(path) / name).string();
    if (spare_count >= kMaxSpareFiles || !detail::is_data_file_name(name) ||
        target()->file_type(file) != FileType::kRegular) {
      continue;
    }
    // Spare names are the retired files' own: a save id makes each one unique.
    target()->rename_file(file, (fs::path(spare_directory_) / name).string());
    ++spare_count;
  }
  target()->remove_tree(path);
}

}  // namespace stowage::dcp
