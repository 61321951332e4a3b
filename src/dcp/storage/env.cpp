// The parts of env.h every Env shares: names of file types, and the forwarding Env.
#include <stowage/dcp/env.h>

namespace stowage::dcp {

const char* describe(FileType type) {
  switch (type) {
    case FileType::kAbsent:
      return "absent";
    case FileType::kRegular:
      return "a regular file";
    case FileType::kDirectory:
      return "a directory";
    case FileType::kSymbolicLink:
      return "a symbolic link";
    case FileType::kFifo:
      return "a FIFO";
    case FileType::kSocket:
      return "a socket";
    case FileType::kCharacterDevice:
      return "a character device";
    case FileType::kBlockDevice:
      return "a block device";
  }
  return "of an unknown type";
}

std::unique_ptr<WritableFile> EnvWrapper::create_file(const std::string& path) {
  return target_->create_file(path);
}
std::unique_ptr<WritableFile> EnvWrapper::reuse_file(const std::string& from, const std::string& to) {
  return target_->reuse_file(from, to);
}
std::unique_ptr<ReadableFile> EnvWrapper::open_for_reading(const std::string& path) {
  return target_->open_for_reading(path);
}
FileType EnvWrapper::file_type(const std::string& path) {
  return target_->file_type(path);
}
void EnvWrapper::rename_file(const std::string& from, const std::string& to) {
  target_->rename_file(from, to);
}
void EnvWrapper::remove_file(const std::string& path) {
  target_->remove_file(path);
}
void EnvWrapper::remove_tree(const std::string& path) {
  target_->remove_tree(path);
}
std::vector<std::string> EnvWrapper::list_directory(const std::string& path) {
  return target_->list_directory(path);
}
void EnvWrapper::create_directories(const std::string& path) {
  target_->create_directories(path);
}
void EnvWrapper::sync_directory(const std::string& path) {
  target_->sync_directory(path);
}
std::unique_ptr<DirectoryLock> EnvWrapper::lock_directory(const std::string& path) {
  return target_->lock_directory(path);
}
std::shared_ptr<ScratchFile> EnvWrapper::create_scratch_file(const std::string& dir, const std::string& stem,
                                                             int64_t bytes) {
  return target_->create_scratch_file(dir, stem, bytes);
}
std::unique_ptr<BatchIo> EnvWrapper::new_batch_io(BatchIoPath path) {
  return target_->new_batch_io(path);
}

}  // namespace stowage::dcp
