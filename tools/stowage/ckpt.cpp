// `stowage ckpt ls | inspect | verify`: look into checkpoints without loading them;
// `stowage ckpt export | import`: to and from Hugging Face safetensors. A checkpoint is
// stowage's or PyTorch DCP's (dcp::open_checkpoint tells them apart). Each command but
// import takes one checkpoint, a directory of step-<N> checkpoints (whatever its name,
// as dcp::CheckpointManager keeps them) or a run directory (its checkpoints/ folder);
// inspect, verify and export then read the latest committed one and say which.
#include "cli_numbers.h"
#include "commands.h"
#include "train_progress.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/dcp.h>
#include <stowage/dcp/verify.h>
#include <stowage/error.h>
#include <stowage/train/run_directory.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/safetensors.h>
#include <stowage/interop/torch_dcp_reader.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace stowage::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// The tensor's bytes (what its chunks hold as stowage stores them; PyTorch DCP stores
// each chunk as a larger torch.save archive).
int64_t entry_bytes(const dcp::EntryMetadata& entry) {
  if (entry.kind != dcp::EntryKind::kTensor) return 0;
  int64_t elements = 1;
  for (int64_t size : entry.shape) elements *= size;
  return elements * dcp::element_size(entry.dtype);
}

int64_t checkpoint_bytes(const dcp::Metadata& metadata) {
  int64_t bytes = 0;
  for (const auto& entry : metadata.entries) bytes += entry_bytes(entry);
  return bytes;
}

bool is_pytorch_dcp(const dcp::StorageReader& reader) {
  return dynamic_cast<const dcp::TorchDcpReader*>(&reader) != nullptr;
}

const char* format_of(const dcp::StorageReader& reader) {
  return is_pytorch_dcp(reader) ? "pytorch-dcp" : "stowage";
}

// The reader of the checkpoint in `dir`, stowage's or PyTorch DCP's; null when `dir`
// holds neither's metadata (dcp::open_checkpoint's NotFound).
std::unique_ptr<dcp::StorageReader> open_if_checkpoint(const std::string& dir) {
  try {
    return dcp::open_checkpoint(dir);
  } catch (const NotFound&) {
    return nullptr;
  }
}

// What the directory argument of a `ckpt` command may be.
constexpr const char* kAcceptedDirectories =
    "a checkpoint directory (holding stowage's .metadata.json or PyTorch DCP's .metadata), a directory of "
    "step-<N> checkpoints, or a run directory (one with a checkpoints/ folder)";

// The directory argument of a `ckpt` command, by what it holds.
struct Target {
  std::unique_ptr<dcp::StorageReader> reader;  // `dir` is one checkpoint
  std::string checkpoints;                     // or: the directory of its step-<N> checkpoints
  bool run = false;                            // that is `dir`/checkpoints of a run directory
};

// The last name of `dir`, also when it ends with a '/'.
std::string last_name(const std::string& dir) {
  const fs::path path = fs::path(dir).lexically_normal();
  return (path.filename().empty() ? path.parent_path().filename() : path.filename()).string();
}

bool is_step_name(const std::string& name) {
  const std::string prefix = "step-";
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](unsigned char c) { return std::isdigit(c) != 0; });
}

// One checkpoint, a directory of step-<N> checkpoints (any name: a CheckpointManager's
// directory), or a run directory (its checkpoints/ folder); InvalidArgument naming `dir`
// and the three when it is none of them.
Target classify(const std::string& dir) {
  Target target;
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (!fs::is_directory(status)) {
    const std::string problem = status.type() == fs::file_type::not_found ? "does not exist"
                                : error ? fmt::format("cannot be read ({})", error.message())
                                        : "is not a directory";
    throw InvalidArgument(fmt::format("'{}' {}: expected {}", dir, problem, kAcceptedDirectories));
  }
  target.reader = open_if_checkpoint(dir);
  if (target.reader) return target;
  const std::string run_checkpoints = train::checkpoints_directory(dir);
  if (fs::is_directory(run_checkpoints, error)) {
    target.checkpoints = run_checkpoints;
    target.run = true;
    return target;
  }
  // A folder named checkpoints with none in it yet is a run's, before its first save.
  if (!dcp::list_checkpoints(dir).empty() || last_name(dir) == "checkpoints") {
    target.checkpoints = dir;
    return target;
  }
  throw InvalidArgument(fmt::format("'{}' is none of what a ckpt command takes: {}{}", dir, kAcceptedDirectories,
                                    is_step_name(last_name(dir))
                                        ? "; it looks like an uncommitted checkpoint (no metadata: a save in "
                                          "flight or the remains of a failed one)"
                                        : ""));
}

// The step-<N> checkpoints of `directory`, oldest first; committed also when PyTorch
// DCP's metadata is there (dcp::list_checkpoints counts only stowage's).
std::vector<dcp::ManagedCheckpoint> checkpoints_in(const std::string& directory) {
  std::vector<dcp::ManagedCheckpoint> found = dcp::list_checkpoints(directory);
  for (auto& checkpoint : found) {
    if (!checkpoint.committed) checkpoint.committed = open_if_checkpoint(checkpoint.path) != nullptr;
  }
  return found;
}

// The checkpoint a command that reads one (inspect, verify, export) reads: `dir`
// itself, or the latest committed checkpoint of a directory of them or of a run.
struct Picked {
  std::string path;
  std::unique_ptr<dcp::StorageReader> reader;
  json origin;  // null when `dir` is the checkpoint; else {from: dir, kind: run|checkpoints, step}
};

Picked pick_checkpoint(const std::string& dir) {
  Target target = classify(dir);
  Picked out;
  if (target.reader) {
    out.path = dir;
    out.reader = std::move(target.reader);
    return out;
  }
  const char* kind = target.run ? "run directory" : "directory of checkpoints";
  const std::vector<dcp::ManagedCheckpoint> all = checkpoints_in(target.checkpoints);
  const auto latest = std::find_if(all.rbegin(), all.rend(), [](const auto& c) { return c.committed; });
  if (latest == all.rend()) {
    throw InvalidArgument(fmt::format("the {} '{}' has no committed checkpoint{}", kind, dir,
                                      all.empty() ? fmt::format(" ({} holds no step-<N> directory)", target.checkpoints)
                                                  : fmt::format(" ({} uncommitted in {}: saves in flight or failed)",
                                                                all.size(), target.checkpoints)));
  }
  out.path = latest->path;
  out.reader = dcp::open_checkpoint(latest->path);
  out.origin = {{"from", dir}, {"kind", target.run ? "run" : "checkpoints"}, {"step", latest->step}};
  return out;
}

// Says which checkpoint was picked, on stderr: stdout stays the command's output.
void say_picked(const Picked& picked) {
  if (picked.origin.is_null()) return;
  fmt::print(stderr, "{}: the latest committed checkpoint of this {} is step {}: {}\n",
             picked.origin["from"].get<std::string>(),
             picked.origin["kind"] == "run" ? "run directory" : "directory of checkpoints",
             picked.origin["step"].get<int64_t>(), picked.path);
  std::fflush(stderr);
}

// What `ls` says of a committed checkpoint.
void describe_committed(dcp::StorageReader& reader, json& row) {
  const dcp::Metadata metadata = reader.read_metadata();
  row["format"] = format_of(reader);
  row["entries"] = metadata.entries.size();
  row["bytes"] = checkpoint_bytes(metadata);
  row["ranks"] = metadata.world_size;
}

// The rows of `ls`: the checkpoints of a directory of them or of a run, only the
// committed ones unless `all` (an uncommitted directory is a save in flight or the
// remains of a failed one, never something to load); or the one checkpoint `dir` is,
// stowage's or PyTorch DCP's.
json list_rows(const std::string& dir, bool all) {
  Target target = classify(dir);
  json rows = json::array();
  if (target.reader) {
    json row{{"step", nullptr}, {"path", dir}, {"committed", true}};
    describe_committed(*target.reader, row);
    rows.push_back(row);
    return rows;
  }
  for (const auto& checkpoint : checkpoints_in(target.checkpoints)) {
    if (!checkpoint.committed && !all) continue;
    json row{{"step", checkpoint.step}, {"path", checkpoint.path}, {"committed", checkpoint.committed}};
    if (checkpoint.committed) describe_committed(*dcp::open_checkpoint(checkpoint.path), row);
    rows.push_back(row);
  }
  return rows;
}

void list(const std::string& dir, bool as_json, bool all) {
  const json rows = list_rows(dir, all);
  if (as_json) {
    fmt::print("{}\n", rows.dump(2));
    return;
  }
  fmt::print("{:>10}  {:<11}  {:<11}  {:>8}  {:>10}  {}\n", "step", "state", "format", "entries", "size", "path");
  for (const auto& row : rows) {
    const bool committed = row["committed"].get<bool>();
    fmt::print("{:>10}  {:<11}  {:<11}  {:>8}  {:>10}  {}\n",
               row["step"].is_null() ? "-" : std::to_string(row["step"].get<int64_t>()),
               committed ? "committed" : "uncommitted", committed ? row["format"].get<std::string>() : "-",
               committed ? std::to_string(row["entries"].get<size_t>()) : "-",
               committed ? format_bytes(row["bytes"].get<int64_t>()) : "-", row["path"].get<std::string>());
  }
}

void inspect(const std::string& dir, bool as_json) {
  const Picked picked = pick_checkpoint(dir);
  if (!as_json) say_picked(picked);
  dcp::StorageReader* const reader = picked.reader.get();
  const dcp::Metadata metadata = reader->read_metadata();
  // PyTorch DCP keeps no checksums (each record's zip CRC32 is checked as it is read).
  const bool checksummed = !is_pytorch_dcp(*reader);
  json entries = json::array();
  for (const auto& entry : metadata.entries) {
    json row{{"key", entry.fqn}};
    if (entry.kind == dcp::EntryKind::kTensor) {
      row["dtype"] = std::string(c10::toString(entry.dtype));
      row["shape"] = entry.shape;
      row["bytes"] = entry_bytes(entry);
      json chunks = json::array();
      for (const auto& chunk : entry.chunks) {
        chunks.push_back({{"offsets", chunk.box.offsets},
                          {"sizes", chunk.box.sizes},
                          {"rank", chunk.rank},
                          {"file", chunk.location.file},
                          {"offset", chunk.location.offset},
                          {"length", chunk.location.length},
                          {"checksum", checksummed ? fmt::format("{:016x}", chunk.location.checksum) : "-"}});
      }
      row["chunks"] = chunks;
    } else {
      std::ostringstream value;
      value << entry.value;
      row["value"] = value.str();
    }
    entries.push_back(row);
  }
  if (as_json) {
    json result{{"path", picked.path},
                {"format", format_of(*reader)},
                {"save_id", metadata.save_id},
                {"ranks", metadata.world_size},
                {"version", metadata.version}};
    if (!picked.origin.is_null()) result["picked"] = picked.origin;
    result["entries"] = entries;
    fmt::print("{}\n", result.dump(2));
    return;
  }
  const std::string format = checksummed ? fmt::format("stowage format {}", metadata.version) : "PyTorch DCP";
  fmt::print("{}: {}, save {}, {} rank(s), {} entries, {}\n", picked.path, format, metadata.save_id,
             metadata.world_size, metadata.entries.size(), format_bytes(checkpoint_bytes(metadata)));
  for (const auto& row : entries) {
    if (!row.contains("dtype")) {
      fmt::print("  {:<48} value {}\n", row["key"].get<std::string>(), row["value"].get<std::string>());
      continue;
    }
    std::vector<std::string> checksums;
    for (const auto& chunk : row["chunks"]) checksums.push_back(chunk["checksum"].get<std::string>());
    const std::string shape = fmt::format("[{}]", fmt::join(row["shape"].get<std::vector<int64_t>>(), ", "));
    fmt::print("  {:<48} {:<9} {:<14} {:>10}  {} chunk(s) xxh3 {}\n", row["key"].get<std::string>(),
               row["dtype"].get<std::string>(), shape, format_bytes(row["bytes"].get<int64_t>()), row["chunks"].size(),
               fmt::join(checksums, ","));
  }
}

// Reads every chunk and checks its checksum, one chunk at a time. Returns false (and
// reports the first bad entry) when one fails.
bool verify(const std::string& dir, bool as_json) {
  const Picked picked = pick_checkpoint(dir);
  if (!as_json) say_picked(picked);
  const dcp::VerifyReport report = dcp::verify(*picked.reader);
  json result{{"path", picked.path},
              {"ok", report.ok()},
              {"chunks_verified", report.chunks_verified},
              {"bytes_verified", report.bytes_verified}};
  if (!picked.origin.is_null()) result["picked"] = picked.origin;
  if (!report.ok()) result["error"] = report.error;
  if (as_json) {
    fmt::print("{}\n", result.dump(2));
  } else if (report.ok()) {
    fmt::print("{}: ok, {} chunks ({}) verified\n", picked.path, report.chunks_verified,
               format_bytes(report.bytes_verified));
  } else {
    fmt::print("{}: FAILED after {} good chunks: {}\n", picked.path, report.chunks_verified, report.error);
  }
  return report.ok();
}

struct TransferOptions {
  std::string source;
  std::string out;
  std::string max_shard_size = "5GB";
  std::string prefix;
  bool overwrite = false;
  bool json = false;
};

void print_transfer(const char* verb, const std::vector<std::string>& files, int64_t tensors, int64_t bytes,
                    int64_t values, double seconds, bool as_json, const json& picked = nullptr) {
  if (as_json) {
    json result{{"files", files},   {"tensors", tensors}, {"tensor_bytes", bytes},
                {"values", values}, {"seconds", seconds}, {"gbps", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0}};
    if (!picked.is_null()) result["picked"] = picked;
    fmt::print("{}\n", result.dump(2));
    return;
  }
  fmt::print("{} {} tensors ({}) and {} values in {:.2f} s ({:.2f} GB/s): {}\n", verb, tensors, format_bytes(bytes),
             values, seconds, seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0, fmt::join(files, ", "));
}

// The library's messages name its options as the API spells them ("export with
// overwrite", "the option overwrite is off"); the user typed flags. Called in the
// handler of `error`: throws its message with the flag in their place, or rethrows it.
[[noreturn]] void rethrow_naming_flags(const Error& error) {
  std::string message = error.what();
  const std::string pass = "; pass --overwrite to replace it";
  bool changed = false;
  for (const std::string& library :
       {std::string("; export with overwrite to replace it"), std::string(" and the option overwrite is off")}) {
    if (const size_t at = message.find(library); at != std::string::npos) {
      message.replace(at, library.size(), pass);
      changed = true;
    }
  }
  const std::string writer = "FileSystemWriter: ";
  if (changed && message.compare(0, writer.size(), writer) == 0) message.erase(0, writer.size());
  if (!changed) throw;
  throw InvalidArgument(message);
}

void export_checkpoint(const TransferOptions& options) {
  const Picked picked = pick_checkpoint(options.source);
  if (!options.json) say_picked(picked);
  const auto start = std::chrono::steady_clock::now();
  dcp::SafetensorsExportResult result;
  try {
    result = dcp::export_safetensors(*picked.reader, options.out,
                                     dcp::SafetensorsExportOptions()
                                         .prefix(options.prefix)
                                         .max_shard_bytes(*parse_byte_size(options.max_shard_size))
                                         .overwrite(options.overwrite));
  } catch (const Error& e) {
    rethrow_naming_flags(e);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_transfer("exported", result.files, result.tensors, result.tensor_bytes, result.values, took.count(),
                 options.json, picked.origin);
}

void import_checkpoint(const TransferOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  dcp::SafetensorsImportResult result;
  try {
    result = dcp::import_safetensors(
        options.source, options.out,
        dcp::SafetensorsImportOptions().writer(dcp::FileSystemWriterOptions().overwrite(options.overwrite)));
  } catch (const Error& e) {
    rethrow_naming_flags(e);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_transfer("imported", result.files, result.tensors, result.tensor_bytes, result.values, took.count(),
                 options.json);
}

void add_transfer_commands(CLI::App& ckpt) {
  auto options = std::make_shared<TransferOptions>();
  auto* exporter = ckpt.add_subcommand("export", "Write a checkpoint's tensors as Hugging Face safetensors");
  exporter
      ->add_option("dir", options->source,
                   "a checkpoint directory, or a directory of step-<N> checkpoints or a run directory (its latest "
                   "committed checkpoint)")
      ->required();
  exporter->add_option("--format", "output format")->check(CLI::IsMember({"safetensors"}))->default_val("safetensors");
  exporter->add_option("--out", options->out, "the .safetensors file (shards and an index beside it when larger)")
      ->required();
  exporter->add_option("--max-shard-size", options->max_shard_size, "largest shard, e.g. 5GB, 512MiB")
      ->check(byte_size())
      ->capture_default_str();
  exporter->add_option("--prefix", options->prefix, "only entries under this prefix (e.g. model.), without it");
  auto* importer = ckpt.add_subcommand("import", "Write a checkpoint from safetensors (a file or an index.json)");
  importer->add_option("source", options->source, "a .safetensors file, or a *.safetensors.index.json")->required();
  importer->add_option("--out", options->out, "checkpoint directory to write")->required();
  for (CLI::App* sub : {exporter, importer}) {
    sub->add_flag("--overwrite", options->overwrite, "replace existing output");
    sub->add_flag("--json", options->json, "machine-readable output");
  }
  exporter->callback([options] { export_checkpoint(*options); });
  importer->callback([options] { import_checkpoint(*options); });
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto* ckpt = app.add_subcommand("ckpt", "List, inspect, verify, export and import checkpoints");
  ckpt->require_subcommand(1);
  struct Options {
    std::string dir;
    bool json = false;
    bool all = false;
  };
  auto options = std::make_shared<Options>();
  auto* ls = ckpt->add_subcommand(
      "ls", "List the checkpoints of a run directory or of a directory of step-<N> checkpoints, or one checkpoint");
  auto* show =
      ckpt->add_subcommand("inspect", "Show a checkpoint's entries: key, dtype, shape, bytes, chunks, checksum");
  auto* check = ckpt->add_subcommand("verify", "Read every chunk of a checkpoint and verify its checksum");
  for (CLI::App* sub : {ls, show, check}) {
    sub->add_option("dir", options->dir,
                    sub == ls ? "a run directory, a directory of step-<N> checkpoints, or a checkpoint directory"
                              : "a checkpoint directory, or a directory of step-<N> checkpoints or a run directory "
                                "(its latest committed checkpoint)")
        ->required();
    sub->add_flag("--json", options->json, "machine-readable output");
  }
  ls->add_flag("--all", options->all, "also list uncommitted directories (saves in flight or failed)");
  ls->callback([options] { list(options->dir, options->json, options->all); });
  show->callback([options] { inspect(options->dir, options->json); });
  check->callback([options] {
    if (!verify(options->dir, options->json)) throw CLI::RuntimeError(2);
  });
  add_transfer_commands(*ckpt);
}

}  // namespace stowage::cli
