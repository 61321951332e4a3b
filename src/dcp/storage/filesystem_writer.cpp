#include "dcp/format/hash_state.h"
#include "dcp/storage/copy_ahead.h"
#include "dcp/storage/file_io.h"
#include "util/error_context.h"
#include "util/parallel_jobs.h"

#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <unordered_set>

namespace stowage::dcp {
namespace {

// Bytes hashed and written per system call: large enough for full disk speed, small
// enough that the write reads what the hash left in the core's cache (on tmpfs, 8 MiB
// pieces wrote 20% slower than 1 MiB); whole checksum blocks.
constexpr int64_t kPieceBytes = int64_t(1) << 20;
static_assert(kPieceBytes % kChecksumBlockBytes == 0);

int64_t align_up(int64_t offset) {
  return (offset + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
}

// Writes `host`'s bytes at location.offset of `file`, a piece at a time, hashing them block
// by block as they go (so that the second hash reads what the first left in cache); sets
// location's length, checksum and, for more than one block, block checksums.
void write_checksummed(WritableFile& file, const at::Tensor& host, bool start_writeback, StorageLocation& location) {
  const int64_t length = static_cast<int64_t>(host.nbytes());
  const char* bytes = static_cast<const char*>(host.data_ptr());
  const detail::HashState state = detail::new_hash_state();
  for (int64_t done = 0; done < length; done += kPieceBytes) {
    const int64_t piece = std::min(kPieceBytes, length - done);
    for (int64_t block = 0; block < piece; block += kChecksumBlockBytes) {
      const char* block_bytes = bytes + done + block;
      const size_t block_length = static_cast<size_t>(std::min(kChecksumBlockBytes, piece - block));
      XXH3_64bits_update(state.get(), block_bytes, block_length);
      if (length > kChecksumBlockBytes) location.block_checksums.push_back(XXH3_64bits(block_bytes, block_length));
    }
    file.write_at(bytes + done, piece, location.offset + done);
    if (start_writeback) file.start_writeback(location.offset + done, piece);
  }
  location.checksum = XXH3_64bits_digest(state.get());
  location.length = length;
}

// A data file and the plan items that go into it, in order.
struct FileJob {
  std::string name;
  std::vector<const WriteItem*> items;
};

std::vector<FileJob> assign_files(const SavePlan& plan, const FileSystemWriterOptions& options) {
  std::vector<const WriteItem*> items;
  for (const WriteItem& item : plan.items) {
    if (item.kind == EntryKind::kTensor) items.push_back(&item);
  }
  std::vector<FileJob> jobs;
  if (!options.single_file_per_rank()) {
    for (size_t i = 0; i < items.size(); ++i) {
      jobs.push_back(FileJob{fmt::format("{}-i{}.data", plan.file_prefix, i), {items[i]}});
    }
    return jobs;
  }
  // Largest first, each into the file with the fewest bytes so far: balanced threads.
  std::stable_sort(items.begin(), items.end(),
                   [](const WriteItem* a, const WriteItem* b) { return a->nbytes > b->nbytes; });
  const size_t count = static_cast<size_t>(options.thread_count());
  std::vector<int64_t> bytes(count, 0);
  jobs.resize(count);
  for (size_t k = 0; k < count; ++k) jobs[k].name = fmt::format("{}-{}.data", plan.file_prefix, k);
  for (const WriteItem* item : items) {
    const size_t lightest = std::min_element(bytes.begin(), bytes.end()) - bytes.begin();
    jobs[lightest].items.push_back(item);
    bytes[lightest] += item->nbytes;
  }
  jobs.erase(std::remove_if(jobs.begin(), jobs.end(), [](const FileJob& job) { return job.items.empty(); }),
             jobs.end());
  return jobs;
}

// Whether `name` is a file a save of this writer creates: "data-<16 hex>-r..." ending
// in ".data", or "<metadata>.tmp-<16 hex>". Nothing else in the directory is touched.
bool is_save_file_name(const std::string& name) {
  static const std::string temp_prefix = std::string(kMetadataFileName) + ".tmp-";
  if (name.rfind(temp_prefix, 0) == 0) {
    return name.size() == temp_prefix.size() + 16 && detail::is_hex(name, temp_prefix.size(), 16);
  }
  return detail::is_data_file_name(name);
}

// For cleaning up: a file that cannot be removed stays an orphan, which a later save removes.
void remove_if_possible(Env& env, const std::string& path) noexcept {
  try {
    env.remove_file(path);
  } catch (const std::exception&) {
  }
}

// Deletes the files of stowage's naming that the committed checkpoint in `path` does
// not list. Call only while no other save is in flight. When the committed metadata
// cannot be read, its data files cannot be told from orphans and are left alone.
void remove_orphans(Env& env, const std::string& path) {
  const std::string metadata_path = detail::join_path(path, kMetadataFileName);
  std::unordered_set<std::string> referenced;
  bool data_files_known = true;
  try {
    if (detail::file_exists(env, metadata_path)) {
      for (std::string& name : decode_metadata(detail::read_text_file(env, metadata_path), metadata_path).files()) {
        referenced.insert(std::move(name));
      }
    }
  } catch (const Error&) {
    data_files_known = false;
  }
  // Cleaning is best effort: what cannot be listed or removed now, the next save removes.
  try {
    for (const std::string& name : env.list_directory(path)) {
      if (!is_save_file_name(name) || referenced.count(name) != 0) continue;
      if (name.rfind("data-", 0) == 0 && !data_files_known) continue;
      remove_if_possible(env, detail::join_path(path, name));
    }
  } catch (const Error&) {
  }
}

}  // namespace

FileSystemWriter::FileSystemWriter(std::string path, FileSystemWriterOptions options)
    : BlockingAsyncStager(options.cache_staged_state_dict()), path_(std::move(path)), options_(options) {
  if (path_.empty()) throw InvalidArgument("FileSystemWriter: the checkpoint path is empty");
  if (options_.env() == nullptr) throw InvalidArgument("FileSystemWriter: the option env is null");
  if (options_.thread_count() < 1) {
    throw InvalidArgument(
        fmt::format("FileSystemWriter: thread_count must be at least 1, got {}", options_.thread_count()));
  }
  if (options_.per_thread_copy_ahead() < 0) {
    throw InvalidArgument(fmt::format("FileSystemWriter: per_thread_copy_ahead must not be negative, got {}",
                                      options_.per_thread_copy_ahead()));
  }
}

SaveableState FileSystemWriter::stage(const SaveableState& state) {
  // Staged data is on the CPU already: copying ahead of the writes buys nothing.
  options_.per_thread_copy_ahead(0);
  return BlockingAsyncStager::stage(state);
}

void FileSystemWriter::on_item_written(const WriteResult&) {}

SavePlan FileSystemWriter::prepare_local_plan(SavePlan plan) {
  Env& env = *options_.env();
  try {
    env.create_directories(path_);
  } catch (const Error&) {
    util::rethrow_in_context("FileSystemWriter: cannot make the checkpoint directory: ", "");
  }
  // A FIFO, socket, device node or directory in the metadata's place would be read
  // (blocking, for a FIFO) or replaced by the commit: refused, before anything is written.
  try {
    detail::refuse_special_file(env, detail::join_path(path_, kMetadataFileName));
  } catch (const Error&) {
    util::rethrow_in_context(fmt::format("FileSystemWriter: cannot save into '{}': ", path_), "");
  }
  if (!options_.overwrite() && detail::file_exists(env, detail::join_path(path_, kMetadataFileName))) {
    throw InvalidArgument(
        fmt::format("FileSystemWriter: '{}' already holds a checkpoint and the option overwrite is off", path_));
  }
  coordinator_ = false;
  // A lock still held from an earlier save is released only after the new one is
  // taken (it also keeps this save from cleaning, harmlessly).
  std::unique_ptr<DirectoryLock> lock = env.lock_directory(path_);
  if (lock->try_lock_exclusive()) remove_orphans(env, path_);
  lock->lock_shared();
  lock_ = std::move(lock);
  std::lock_guard<std::mutex> guard(created_mutex_);
  created_files_.clear();
  return plan;
}

std::vector<SavePlan> FileSystemWriter::prepare_global_plan(std::vector<SavePlan> plans, const Metadata& metadata) {
  for (SavePlan& plan : plans) {
    plan.file_prefix = fmt::format("data-{}-r{}", metadata.save_id, plan.rank);
  }
  coordinator_ = true;
  return plans;
}

std::vector<WriteResult> FileSystemWriter::write_data(const SavePlan& plan, std::vector<c10::IValue>& data) {
  const std::vector<FileJob> jobs = assign_files(plan, options_);
  std::vector<std::vector<WriteResult>> results(jobs.size());
  const auto write_file = [&](size_t j, const std::atomic<bool>& failed) {
    const FileJob& job = jobs[j];
    const std::string file_path = detail::join_path(path_, job.name);
    {
      std::lock_guard<std::mutex> lock(created_mutex_);
      created_files_.push_back(file_path);
    }
    const std::unique_ptr<WritableFile> file = options_.env()->create_file(file_path);
    std::vector<at::Tensor> tensors;
    for (const WriteItem* item : job.items) tensors.push_back(data[item->data_index].toTensor());
    detail::CopyAhead host_bytes(std::move(tensors), options_.per_thread_copy_ahead());
    int64_t end = 0;
    for (size_t n = 0; n < job.items.size() && !failed.load(); ++n) {
      const WriteItem* item = job.items[n];
      WriteResult result;
      result.fqn = item->fqn;
      result.box = item->box;
      result.rank = plan.rank;
      result.location.file = job.name;
      result.location.offset = align_up(end);
      // Raw row-major bytes: contiguous, on the CPU, with lazy conjugation/negation resolved.
      write_checksummed(*file, host_bytes.take(n), options_.sync_files(), result.location);
      end = result.location.offset + result.location.length;
      // The bytes are in the file: drop our reference, freeing a buffer nobody else holds.
      data[item->data_index] = c10::IValue();
      on_item_written(result);
      results[j].push_back(std::move(result));
    }
    if (failed.load()) return;
    if (options_.sync_files()) file->sync();
    file->close();
  };
  const size_t threads = std::min<size_t>(jobs.size(), static_cast<size_t>(options_.thread_count()));
  util::run_parallel_jobs(jobs.size(), std::max<size_t>(threads, 1), write_file);
  // A rank that does not coordinate is done; the coordinator's lock guards its files.
  if (!coordinator_) lock_.reset();

  std::vector<WriteResult> all;
  for (auto& file_results : results) {
    for (WriteResult& result : file_results) all.push_back(std::move(result));
  }
  return all;
}

void FileSystemWriter::finish(const Metadata& metadata) {
  Env& env = *options_.env();
  const std::string text = encode_metadata(metadata);
  const std::string final_path = detail::join_path(path_, kMetadataFileName);
  const std::string temp_path = fmt::format("{}.tmp-{}", final_path, metadata.save_id);
  {
    std::lock_guard<std::mutex> lock(created_mutex_);
    created_files_.push_back(temp_path);
  }
  const std::unique_ptr<WritableFile> file = env.create_file(temp_path);
  file->write_at(text.data(), static_cast<int64_t>(text.size()), 0);
  if (options_.sync_files()) file->sync();
  file->close();

  // The data files of the checkpoint being replaced, to delete once the new one is
  // committed. An old metadata file that cannot be read leaves its files in place (the
  // next save removes them as orphans).
  std::vector<std::string> old_files;
  try {
    if (detail::file_exists(env, final_path)) {
      old_files = decode_metadata(detail::read_text_file(env, final_path), final_path).files();
    }
  } catch (const Error&) {
  }
  if (!options_.overwrite() && detail::file_exists(env, final_path)) {
    throw InvalidArgument(
        fmt::format("FileSystemWriter: '{}' already holds a checkpoint and the option overwrite is off", path_));
  }
  try {
    env.rename_file(temp_path, final_path);
  } catch (const Error&) {
    util::rethrow_in_context("FileSystemWriter: cannot commit the checkpoint's metadata: ", "");
  }
  // Committed: nothing of this save may be removed any more.
  {
    std::lock_guard<std::mutex> lock(created_mutex_);
    created_files_.clear();
  }
  if (options_.sync_files()) env.sync_directory(path_);

  const std::vector<std::string> new_files = metadata.files();
  const std::unordered_set<std::string> keep(new_files.begin(), new_files.end());
  for (const std::string& name : old_files) {
    if (keep.count(name) == 0) remove_if_possible(env, detail::join_path(path_, name));
  }
  lock_.reset();
}

void FileSystemWriter::abort() noexcept {
  std::lock_guard<std::mutex> lock(created_mutex_);
  for (const std::string& file : created_files_) remove_if_possible(*options_.env(), file);
  created_files_.clear();
  lock_.reset();
}

}  // namespace stowage::dcp
