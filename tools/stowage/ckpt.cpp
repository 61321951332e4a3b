// `stowage ckpt ls | inspect | verify`: look into checkpoints without loading them;
// `stowage ckpt export | import`: to and from Hugging Face safetensors. A checkpoint is
// stowage's or PyTorch DCP's (dcp::open_checkpoint tells them apart).
#include "cli_numbers.h"
#include "commands.h"
#include "train_progress.h"

#include <stowage/dcp/checkpoint_manager.h>
#include <stowage/dcp/dcp.h>
#include <stowage/dcp/safetensors.h>
#include <stowage/dcp/torch_dcp_reader.h>
#include <stowage/dcp/verify.h>
#include <stowage/error.h>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <sstream>

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

// `dir` is a run directory (its checkpoints), or a directory of step-<N> checkpoints.
std::string run_dir_of(const std::string& dir) {
  return fs::path(dir).filename() == "checkpoints" ? fs::path(dir).parent_path().string() : dir;
}

// What `ls` says of a committed checkpoint.
void describe_committed(dcp::StorageReader& reader, json& row) {
  const dcp::Metadata metadata = reader.read_metadata();
  row["format"] = format_of(reader);
  row["entries"] = metadata.entries.size();
  row["bytes"] = checkpoint_bytes(metadata);
  row["ranks"] = metadata.world_size;
}

// The rows of `ls`: a run's checkpoints, only the committed ones unless `all` (an
// uncommitted directory is a save in flight or the remains of a failed one, never
// something to load); or the one checkpoint `dir` is, stowage's or PyTorch DCP's.
json list_rows(const std::string& dir, bool all) {
  const std::string run_checkpoints = checkpoints_dir(run_dir_of(dir));
  json rows = json::array();
  if (!fs::is_directory(run_checkpoints)) {
    std::unique_ptr<dcp::StorageReader> reader;
    try {
      reader = dcp::open_checkpoint(dir);
    } catch (const IoError& e) {
      if (e.error_number() != ENOENT) throw;
      throw InvalidArgument(
          fmt::format("'{}' is neither a run directory (it has no checkpoints/ folder) nor a checkpoint", dir));
    }
    json row{{"step", nullptr}, {"path", dir}, {"committed", true}};
    describe_committed(*reader, row);
    rows.push_back(row);
    return rows;
  }
  for (const auto& checkpoint : dcp::list_checkpoints(run_checkpoints)) {
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
  const std::unique_ptr<dcp::StorageReader> reader = dcp::open_checkpoint(dir);
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
    fmt::print("{}\n", json{{"path", dir},
                            {"format", format_of(*reader)},
                            {"save_id", metadata.save_id},
                            {"ranks", metadata.world_size},
                            {"version", metadata.version},
                            {"entries", entries}}
                           .dump(2));
    return;
  }
  const std::string format = checksummed ? fmt::format("stowage format {}", metadata.version) : "PyTorch DCP";
  fmt::print("{}: {}, save {}, {} rank(s), {} entries, {}\n", dir, format, metadata.save_id, metadata.world_size,
             metadata.entries.size(), format_bytes(checkpoint_bytes(metadata)));
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
  const std::unique_ptr<dcp::StorageReader> reader = dcp::open_checkpoint(dir);
  const dcp::VerifyReport report = dcp::verify(*reader);
  json result{{"path", dir},
              {"ok", report.ok()},
              {"chunks_verified", report.chunks_verified},
              {"bytes_verified", report.bytes_verified}};
  if (!report.ok()) result["error"] = report.error;
  if (as_json) {
    fmt::print("{}\n", result.dump(2));
  } else if (report.ok()) {
    fmt::print("{}: ok, {} chunks ({}) verified\n", dir, report.chunks_verified, format_bytes(report.bytes_verified));
  } else {
    fmt::print("{}: FAILED after {} good chunks: {}\n", dir, report.chunks_verified, report.error);
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
                    int64_t values, double seconds, bool as_json) {
  if (as_json) {
    fmt::print("{}\n", json{{"files", files},
                            {"tensors", tensors},
                            {"tensor_bytes", bytes},
                            {"values", values},
                            {"seconds", seconds},
                            {"gbps", seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0}}
                           .dump(2));
    return;
  }
  fmt::print("{} {} tensors ({}) and {} values in {:.2f} s ({:.2f} GB/s): {}\n", verb, tensors, format_bytes(bytes),
             values, seconds, seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0, fmt::join(files, ", "));
}

void export_checkpoint(const TransferOptions& options) {
  const std::unique_ptr<dcp::StorageReader> reader = dcp::open_checkpoint(options.source);
  const auto start = std::chrono::steady_clock::now();
  const dcp::SafetensorsExportResult result =
      dcp::export_safetensors(*reader, options.out,
                              dcp::SafetensorsExportOptions()
                                  .prefix(options.prefix)
                                  .max_shard_bytes(*parse_byte_size(options.max_shard_size))
                                  .overwrite(options.overwrite));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_transfer("exported", result.files, result.tensors, result.tensor_bytes, result.values, took.count(),
                 options.json);
}

void import_checkpoint(const TransferOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const dcp::SafetensorsImportResult result = dcp::import_safetensors(
      options.source, options.out,
      dcp::SafetensorsImportOptions().writer(dcp::FileSystemWriterOptions().overwrite(options.overwrite)));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_transfer("imported", result.files, result.tensors, result.tensor_bytes, result.values, took.count(),
                 options.json);
}

void add_transfer_commands(CLI::App& ckpt) {
  auto options = std::make_shared<TransferOptions>();
  auto* exporter = ckpt.add_subcommand("export", "Write a checkpoint's tensors as Hugging Face safetensors");
  exporter->add_option("dir", options->source, "checkpoint directory")->required();
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
  auto* ls = ckpt->add_subcommand("ls", "List a run's checkpoints (run directory or its checkpoints/)");
  auto* show =
      ckpt->add_subcommand("inspect", "Show a checkpoint's entries: key, dtype, shape, bytes, chunks, checksum");
  auto* check = ckpt->add_subcommand("verify", "Read every chunk of a checkpoint and verify its checksum");
  for (CLI::App* sub : {ls, show, check}) {
    sub->add_option("dir", options->dir, "directory")->required();
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
