#pragma once

// Checkpoints in a directory of the local file system (docs/FORMAT.md).
//
// Commit protocol, the invariant every reader relies on: data files are written under
// names no earlier save used (they carry the save id), the metadata file is written
// last to a temporary name, synced, and renamed over the old one, then the directory
// is synced. So a reader sees the previous checkpoint or the new one, never a mixture,
// and a save that fails or crashes before the rename leaves the previous checkpoint as
// it was. Only after the rename are the previous checkpoint's data files deleted.
//
// Orphans (data files and temporary metadata of a save that crashed) are removed by the
// next save, under this rule: every save holds a shared flock on the directory from
// prepare_local_plan until it commits or aborts (a rank that does not coordinate:
// until its data is written; the coordinator's lock spans every rank's writes). A save
// that can take the lock exclusively first knows no other save is in flight, so every
// file of stowage's naming that the committed metadata does not list is an orphan and
// is deleted; then it holds the lock shared like every other save. A killed process's
// lock dies with it. Locks are advisory: only stowage writers on one host honour them.

#include <stowage/dcp/env.h>
#include <stowage/dcp/staging.h>
#include <stowage/dcp/storage.h>

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace stowage::dcp {

struct FileSystemWriterOptions {
  // One data file per rank and writer thread; otherwise one per tensor chunk.
  TORCH_ARG(bool, single_file_per_rank) = true;
  // fsync data files, the metadata and the directory. Without it a crash may lose the
  // checkpoint (readers still never see a partial one).
  TORCH_ARG(bool, sync_files) = true;
  // Threads writing data files in parallel, at least 1 (the caller's thread is one).
  TORCH_ARG(int64_t, thread_count) = 1;
  // Bytes of device-to-host copies each writer thread starts ahead of the item it is
  // writing, for tensors saved without staging that are not on the CPU: they copy
  // (into pinned memory where the build can pin, on a copy stream where the device has
  // streams) while the thread hashes and writes. CPU tensors are written from their
  // own memory: no copy, so the option changes nothing for them (nor on a CPU-only
  // build). stage() sets it to 0: staged data is on the CPU already.
  TORCH_ARG(int64_t, per_thread_copy_ahead) = 10'000'000;
  // Reuse the staging buffers of stage() across saves (BlockingAsyncStager).
  TORCH_ARG(bool, cache_staged_state_dict) = false;
  // Replace an existing checkpoint in the directory; without it, saving over one is an
  // error.
  TORCH_ARG(bool, overwrite) = true;
  // Every file-system call goes through it (env.h); it must outlive the writer.
  TORCH_ARG(EnvPointer, env) = Env::posix();
};

// Writes checkpoints into one directory. It is also the stager async_save uses when
// none is given: a BlockingAsyncStager with the writer's cache_staged_state_dict (see
// BlockingAsyncStager for sharing: cached, async_save waits for the save still writing
// its previous snapshot, also when that save runs on another writer).
class FileSystemWriter : public StorageWriter, public BlockingAsyncStager {
 public:
  explicit FileSystemWriter(std::string path, FileSystemWriterOptions options = {});

  const std::string& path() const { return path_; }
  const FileSystemWriterOptions& options() const { return options_; }

  // Sets per_thread_copy_ahead to 0, then stages like BlockingAsyncStager.
  SaveableState stage(const SaveableState& state) override;

  SavePlan prepare_local_plan(SavePlan plan) override;
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan> plans, const Metadata& metadata) override;
  std::vector<WriteResult> write_data(const SavePlan& plan, std::vector<c10::IValue>& data) override;
  void finish(const Metadata& metadata) override;
  void abort() noexcept override;

 protected:
  // Called on a writer thread once an item's bytes are in its file (before any
  // fsync): a place for progress reports. An exception fails the save.
  virtual void on_item_written(const WriteResult& result);

 private:
  std::string path_;
  FileSystemWriterOptions options_;
  std::mutex created_mutex_;
  std::vector<std::string> created_files_;  // by the save in progress, for abort()
  std::unique_ptr<DirectoryLock> lock_;     // held by the save in progress
  bool coordinator_ = false;                // prepare_global_plan ran for this save
};

// Reads checkpoints from one directory. A chunk read in full is verified against its
// checksum; a part of one is read as the checksum blocks it touches, each verified
// (docs/FORMAT.md). Paths in the metadata never leave the directory, and symbolic links
// are not followed. Data files are read through read-only mappings (no copy into a
// buffer of the reader's), after checking every range against the file's size; a file
// truncated by someone else while it is read fails the read with an Error instead of
// a SIGBUS (src/dcp/storage/mapped_file.h installs the process's SIGBUS handler for that).
class FileSystemReader : public StorageReader {
 public:
  // Every file-system call goes through `env` (env.h), which must outlive the reader.
  explicit FileSystemReader(std::string path, Env* env = Env::posix());
  ~FileSystemReader() override;

  const std::string& path() const { return path_; }

  Metadata read_metadata() override;
  void read_data(std::vector<ChunkRead>& reads) override;
  bool verify_data(std::vector<ChunkRead>& reads) override;

  // Bytes of data files checked against their checksums since read_metadata(): what
  // the reads since then had to read.
  int64_t bytes_read() const { return bytes_checked_; }

 private:
  struct OpenFile;
  void run_reads(std::vector<ChunkRead>& reads, bool verify_only);

  std::string path_;
  Env* env_;
  // The files of the checkpoint read_metadata() returned, opened then, so that an
  // overwrite that deletes them cannot take them away.
  std::unordered_map<std::string, std::shared_ptr<OpenFile>> files_;
  int64_t bytes_checked_ = 0;
};

}  // namespace stowage::dcp
