#include "dcp/checkpoint_transfer.h"

#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/metadata.h>
#include <stowage/error.h>
#include <stowage/memory/host_buffer.h>

#include "util/exception_message.h"

#include <ATen/ops/empty.h>

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

namespace stowage::dcp {
namespace {
namespace fs = std::filesystem;

// A file of the stream: its name, its length, and where its bytes begin in the stream.
struct StreamFile {
  std::string name;
  int64_t length = 0;
  int64_t start = 0;
};

// The stream's files in order (the metadata last), and its length.
struct StreamLayout {
  std::vector<StreamFile> files;
  int64_t length = 0;

  void add(std::string name, int64_t file_length) {
    files.push_back({std::move(name), file_length, length});
    length += file_length;
  }
  // Calls visit(file index, offset in the file, offset in [begin, begin + bytes), bytes)
  // for each file's part of the stream's bytes [begin, begin + bytes).
  void for_each_part(int64_t begin, int64_t bytes,
                     const std::function<void(size_t, int64_t, int64_t, int64_t)>& visit) const {
    for (size_t i = 0; i < files.size(); ++i) {
      const int64_t from = std::max(begin, files[i].start);
      const int64_t to = std::min(begin + bytes, files[i].start + files[i].length);
      if (from < to) visit(i, from - files[i].start, from - begin, to - from);
    }
  }
};

void put_length(std::string& out, uint64_t length) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
}

// Reads what put_length wrote at `at`, advancing it; nothing when fewer than 8 bytes are left.
std::optional<uint64_t> take_length(std::string_view bytes, size_t& at) {
  if (bytes.size() - at < 8) return std::nullopt;
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  at += 8;
  return length;
}

// The header: the stream's length, then each file's name's length, name and length.
std::string encode_header(const StreamLayout& layout) {
  std::string header;
  put_length(header, static_cast<uint64_t>(layout.length));
  for (const StreamFile& file : layout.files) {
    put_length(header, file.name.size());
    header += file.name;
    put_length(header, static_cast<uint64_t>(file.length));
  }
  return header;
}

// The stream's length from a non-empty header: what the receiver must take in, even when
// the rest of the header is wrong.
int64_t stream_length(std::string_view header) {
  size_t at = 0;
  return static_cast<int64_t>(take_length(header, at).value_or(0));
}

// The files a header names. Throws CorruptionError naming `path` for a header that is
// truncated, names a file outside the directory, does not add up to its stream's length
// or has no metadata last.
StreamLayout decode_header(std::string_view header, const std::string& path) {
  const auto corrupt = [&](const std::string& what) {
    return CorruptionError(fmt::format("checkpoint sent for {}: {}", path, what), "", path);
  };
  size_t at = 0;
  const std::optional<uint64_t> length = take_length(header, at);
  StreamLayout layout;
  while (at < header.size()) {
    const std::optional<uint64_t> name_length = take_length(header, at);
    if (!name_length || *name_length > header.size() - at) throw corrupt("its header is truncated");
    std::string name(header.substr(at, *name_length));
    at += *name_length;
    const std::optional<uint64_t> file_length = take_length(header, at);
    if (!file_length) throw corrupt("its header is truncated");
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw corrupt(fmt::format("a file named '{}'", name));
    }
    layout.add(std::move(name), static_cast<int64_t>(*file_length));
  }
  if (!length || static_cast<int64_t>(*length) != layout.length) throw corrupt("its files do not add up to its length");
  if (layout.files.empty() || layout.files.back().name != kMetadataFileName) {
    throw corrupt(fmt::format("its last file is not {}", kMetadataFileName));
  }
  return layout;
}

// The sending side: the committed checkpoint's files, open, and the first read failure.
class Sender {
 public:
  // Opens the checkpoint `path`; throws InvalidArgument when it is not committed or holds
  // anything but plain files, IoError as opening raises it.
  Sender(const std::string& path, Env& env) {
    const std::string metadata = (fs::path(path) / kMetadataFileName).string();
    if (env.file_type(metadata) != FileType::kRegular) {
      throw InvalidArgument(fmt::format("{} is not a committed checkpoint (no {})", path, kMetadataFileName));
    }
    for (const std::string& name : env.list_directory(path)) {
      if (name != kMetadataFileName) open((fs::path(path) / name).string(), name, env);
    }
    open(metadata, kMetadataFileName, env);  // last: its arrival commits the copy
  }

  const StreamLayout& layout() const { return layout_; }

  // Stream bytes [begin, + bytes) into `out`; after a failed read, leaves `out` as it is.
  void read(int64_t begin, int64_t bytes, char* out) {
    if (failed()) return;
    try {
      layout_.for_each_part(begin, bytes, [&](size_t file, int64_t offset, int64_t into, int64_t length) {
        files_[file]->read_at(out + into, length, offset);
      });
    } catch (const std::exception& failure) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_.empty()) error_ = exception_message(failure);
    }
  }
  std::string error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  bool failed() const { return !error().empty(); }
  void open(const std::string& file, const std::string& name, Env& env) {
    if (env.file_type(file) != FileType::kRegular) {
      throw InvalidArgument(fmt::format("{} is {}, not a checkpoint's file", file, describe(env.file_type(file))));
    }
    files_.push_back(env.open_for_reading(file));
    layout_.add(name, files_.back()->size());
  }

  StreamLayout layout_;
  std::vector<std::unique_ptr<ReadableFile>> files_;
  mutable std::mutex mutex_;
  std::string error_;  // the first read's failure
};

// The receiving side: the directory's data files, made, the metadata held in memory until
// the commit, and the first failure (after which nothing more is written).
class Receiver {
 public:
  Receiver(const std::string& path, StreamLayout layout, Env& env)
      : path_(path), layout_(std::move(layout)), env_(env) {
    try {
      remove_checkpoint(path_, env_);
      env_.create_directories(path_);
      for (size_t i = 0; i + 1 < layout_.files.size(); ++i) {
        data_files_.push_back(env_.create_file((fs::path(path_) / layout_.files[i].name).string()));
      }
      metadata_.resize(static_cast<size_t>(layout_.files.back().length));
    } catch (const std::exception& failure) {
      error_ = exception_message(failure);
    }
  }

  // Stream bytes [begin, + bytes), received into `in`, into their files.
  void write(int64_t begin, int64_t bytes, const char* in) {
    std::lock_guard<std::mutex> lock(mutex_);  // one writer at a time: WritableFile is not thread-safe
    if (!error_.empty()) return;
    try {
      layout_.for_each_part(begin, bytes, [&](size_t file, int64_t offset, int64_t from, int64_t length) {
        if (file < data_files_.size()) {
          data_files_[file]->write_at(in + from, length, offset);
        } else {
          std::copy(in + from, in + from + length, metadata_.begin() + offset);
        }
      });
    } catch (const std::exception& failure) {
      error_ = exception_message(failure);
    }
  }

  // Closes the data files and writes the metadata, renamed into place; records a failure.
  void commit() {
    if (!error_.empty()) return;
    try {
      for (const std::unique_ptr<WritableFile>& file : data_files_) file->close();
      const std::string metadata = (fs::path(path_) / kMetadataFileName).string();
      const std::unique_ptr<WritableFile> file = env_.create_file(metadata + ".partial");
      if (!metadata_.empty()) file->write_at(metadata_.data(), static_cast<int64_t>(metadata_.size()), 0);
      file->close();
      env_.rename_file(metadata + ".partial", metadata);
    } catch (const std::exception& failure) {
      error_ = exception_message(failure);
    }
  }

  void fail(const std::string& error) {
    if (error_.empty()) error_ = error;
  }
  const std::string& error() const { return error_; }

 private:
  const std::string path_;
  const StreamLayout layout_;
  Env& env_;
  std::vector<std::unique_ptr<WritableFile>> data_files_;
  std::string metadata_;
  std::mutex mutex_;
  std::string error_;
};

std::string text_of(const at::Tensor& bytes) {
  if (bytes.numel() == 0) return {};  // its data_ptr() may be null
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

at::Tensor bytes_of(const std::string& text) {
  at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
  std::copy(text.begin(), text.end(), static_cast<char*>(bytes.data_ptr()));
  return bytes;
}

// This rank's two streams: the one it sends and the one it receives.
struct Streams {
  Sender* sender = nullptr;      // null: nothing to send
  Receiver* receiver = nullptr;  // null: what comes is dropped (a header that failed)
  int64_t in_length = 0;
};

// Step 2 on one lane: pieces index, index + lanes, ... of both streams.
void move_pieces(const CheckpointTransfer& transfer, const dist::ProcessGroup& lane, size_t index, size_t lanes,
                 const Streams& streams) {
  const int64_t piece = transfer.piece_bytes();
  const int64_t out_length = streams.sender ? streams.sender->layout().length : 0;
  const int64_t in_length = streams.in_length;
  const int64_t pieces = std::max((out_length + piece - 1) / piece, (in_length + piece - 1) / piece);
  memory::HostAllocOptions counted;
  counted.use = memory::HostBufferUse::kCheckpoint;
  const at::Tensor out = memory::allocate_host({std::min(piece, out_length)}, at::kByte, counted);
  const at::Tensor in = memory::allocate_host({std::min(piece, in_length)}, at::kByte, counted);
  for (int64_t k = static_cast<int64_t>(index); k < pieces; k += static_cast<int64_t>(lanes)) {
    const int64_t out_bytes = std::clamp<int64_t>(out_length - k * piece, 0, piece);
    const int64_t in_bytes = std::clamp<int64_t>(in_length - k * piece, 0, piece);
    if (streams.sender && out_bytes > 0) streams.sender->read(k * piece, out_bytes, static_cast<char*>(out.data_ptr()));
    lane.exchange(out.narrow(0, 0, out_bytes), transfer.to(), in.narrow(0, 0, in_bytes), transfer.from());
    if (in_bytes > 0 && streams.receiver) {
      streams.receiver->write(k * piece, in_bytes, static_cast<const char*>(in.data_ptr()));
    }
  }
}

// Step 2 on every lane, the first on this thread; rethrows the first lane's exception.
void move_all_pieces(const CheckpointTransfer& transfer, const std::vector<dist::ProcessGroup>& lanes,
                     const Streams& streams) {
  std::vector<std::exception_ptr> failures(lanes.size());
  const auto run = [&](size_t index) {
    try {
      move_pieces(transfer, lanes[index], index, lanes.size(), streams);
    } catch (...) {
      failures[index] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t index = 1; index < lanes.size(); ++index) threads.emplace_back(run, index);
  run(0);
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace

int64_t transfer_buffer_bytes(int64_t lanes, int64_t piece_bytes, int64_t out_bytes, int64_t in_bytes) {
  return lanes * (memory::host_allocation_bytes(std::min(piece_bytes, out_bytes)) +
                  memory::host_allocation_bytes(std::min(piece_bytes, in_bytes)));
}

TransferOutcome transfer_checkpoint(const CheckpointTransfer& transfer, const std::vector<dist::ProcessGroup>& lanes,
                                    Env& env) {
  if (lanes.empty() || transfer.piece_bytes() < 1) {
    throw InvalidArgument(fmt::format("transfer_checkpoint: {} lanes and pieces of {} bytes (at least 1 of each)",
                                      lanes.size(), transfer.piece_bytes()));
  }
  TransferOutcome outcome;
  std::optional<Sender> sender;
  if (transfer.send_path()) {
    try {
      sender.emplace(*transfer.send_path(), env);
    } catch (const std::exception& failure) {
      outcome.send_error = exception_message(failure);
    }
  }
  const std::string header = sender ? encode_header(sender->layout()) : std::string();
  const std::string received = text_of(lanes[0].shift(bytes_of(header), transfer.to(), transfer.from()));
  outcome.came = !received.empty();
  std::optional<Receiver> receiver;
  if (outcome.came && transfer.receive_path()) {
    try {
      receiver.emplace(*transfer.receive_path(), decode_header(received, *transfer.receive_path()), env);
    } catch (const std::exception& failure) {
      outcome.receive_error = exception_message(failure);
    }
  }
  move_all_pieces(transfer, lanes,
                  Streams{sender ? &*sender : nullptr, receiver ? &*receiver : nullptr,
                          outcome.came ? stream_length(received) : 0});
  if (sender) outcome.send_error = sender->error();
  const std::string sender_error =
      text_of(lanes[0].shift(bytes_of(outcome.send_error), transfer.to(), transfer.from()));
  if (receiver) {
    if (!sender_error.empty()) {
      receiver->fail(fmt::format("rank {} could not read it: {}", transfer.from(), sender_error));
    }
    receiver->commit();
    outcome.receive_error = receiver->error();
    outcome.committed = outcome.receive_error.empty();
  }
  return outcome;
}

}  // namespace stowage::dcp
