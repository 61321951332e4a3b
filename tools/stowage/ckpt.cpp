// `stowage ckpt ls | inspect | verify`: look into checkpoints without loading them;
// `stowage ckpt export | import`: to and from Hugging Face safetensors. Each command but
// import takes what dcp::describe_directory does (one checkpoint, stowage's or PyTorch
// DCP's; a directory of step-<N> checkpoints; a run directory); inspect, verify and
// export then read the one dcp::checkpoint_to_read picks, and say which.
#include "cli_numbers.h"
#include "commands.h"

#include <stowage/byte_count.h>
#include <stowage/dcp/checkpoint_directory.h>
#include <stowage/dcp/metadata.h>
#include <stowage/dcp/verify.h>
#include <stowage/interop/open_checkpoint.h>
#include <stowage/interop/safetensors.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace stowage::cli {
namespace {
using nlohmann::json;

// The checkpoint a command that reads one (inspect, verify, export) reads: `dir`
// itself, or the latest committed checkpoint of a directory of them or of a run.
struct Picked {
  dcp::ReadableCheckpoint checkpoint;
  dcp::DirectoryKind from = dcp::DirectoryKind::kCheckpoint;  // what `dir` is
  std::unique_ptr<dcp::StorageReader> reader;
  json origin;  // null when `dir` is the checkpoint; else {from: dir, kind: run|checkpoints, step}
};

Picked pick_checkpoint(const std::string& dir) {
  const dcp::CheckpointDirectory held = dcp::describe_directory(dir);
  Picked out{dcp::checkpoint_to_read(held), held.kind, nullptr, nullptr};
  out.reader = dcp::open_checkpoint(out.checkpoint.path);
  if (out.checkpoint.step) {
    out.origin = {{"from", dir},
                  {"kind", held.kind == dcp::DirectoryKind::kRun ? "run" : "checkpoints"},
                  {"step", *out.checkpoint.step}};
  }
  return out;
}

// Says which checkpoint was picked, on stderr: stdout stays the command's output.
void say_picked(const Picked& picked) {
  if (picked.origin.is_null()) return;
  fmt::print(stderr, "{}: the latest committed checkpoint of this {} is step {}: {}\n",
             picked.origin["from"].get<std::string>(), dcp::describe(picked.from), *picked.checkpoint.step,
             picked.checkpoint.path);
  std::fflush(stderr);
}

// What `ls` says of a committed checkpoint.
json committed_row(const std::optional<int64_t>& step, const std::string& path, dcp::CheckpointFormat format) {
  const dcp::Metadata metadata = dcp::open_checkpoint(path)->read_metadata();
  return json{{"step", step ? json(*step) : json(nullptr)},
              {"path", path},
              {"committed", true},
              {"format", dcp::format_name(format)},
              {"entries", metadata.entries.size()},
              {"bytes", dcp::tensor_bytes(metadata)},
              {"ranks", metadata.world_size}};
}

// The rows of `ls`: the checkpoints of a directory of them or of a run, only the
// committed ones unless `all` (an uncommitted directory is a save in flight or the
// remains of a failed one, never something to load); or the one checkpoint `dir` is,
// stowage's or PyTorch DCP's.
json list_rows(const std::string& dir, bool all) {
  const dcp::CheckpointDirectory held = dcp::describe_directory(dir);
  if (held.kind == dcp::DirectoryKind::kCheckpoint) return json::array({committed_row({}, dir, held.format)});
  json rows = json::array();
  for (const dcp::ManagedCheckpoint& checkpoint : held.listed) {
    if (checkpoint.committed) {
      rows.push_back(committed_row(checkpoint.step, checkpoint.path, checkpoint.format));
    } else if (all) {
      rows.push_back({{"step", checkpoint.step}, {"path", checkpoint.path}, {"committed", false}});
    }
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
               committed ? bytes_in_units(row["bytes"].get<int64_t>()) : "-", row["path"].get<std::string>());
  }
}

void inspect(const std::string& dir, bool as_json) {
  const Picked picked = pick_checkpoint(dir);
  if (!as_json) say_picked(picked);
  const dcp::Metadata metadata = picked.reader->read_metadata();
  const bool checksummed = picked.checkpoint.format == dcp::CheckpointFormat::kStowage;
  json described = json::parse(dcp::describe_metadata(metadata, checksummed));
  if (as_json) {
    described["path"] = picked.checkpoint.path;
    described["format"] = dcp::format_name(picked.checkpoint.format);
    if (!picked.origin.is_null()) described["picked"] = picked.origin;
    fmt::print("{}\n", described.dump(2));
    return;
  }
  const std::string format = checksummed ? fmt::format("stowage format {}", metadata.version) : "PyTorch DCP";
  fmt::print("{}: {}, save {}, {} rank(s), {} entries, {}\n", picked.checkpoint.path, format, metadata.save_id,
             metadata.world_size, metadata.entries.size(), bytes_in_units(dcp::tensor_bytes(metadata)));
  for (const auto& row : described["entries"]) {
    if (!row.contains("dtype")) {
      fmt::print("  {:<48} value {}\n", row["key"].get<std::string>(), row["value"].get<std::string>());
      continue;
    }
    std::vector<std::string> checksums;
    for (const auto& chunk : row["chunks"]) checksums.push_back(chunk["checksum"].get<std::string>());
    const std::string shape = fmt::format("[{}]", fmt::join(row["shape"].get<std::vector<int64_t>>(), ", "));
    fmt::print("  {:<48} {:<9} {:<14} {:>10}  {} chunk(s) xxh3 {}\n", row["key"].get<std::string>(),
               row["dtype"].get<std::string>(), shape, bytes_in_units(row["bytes"].get<int64_t>()),
               row["chunks"].size(), fmt::join(checksums, ","));
  }
}

// Reads every chunk and checks its checksum, one chunk at a time. Returns false (and
// reports the first bad entry) when one fails.
bool verify(const std::string& dir, bool as_json) {
  const Picked picked = pick_checkpoint(dir);
  if (!as_json) say_picked(picked);
  const dcp::VerifyReport report = dcp::verify(*picked.reader);
  json result{{"path", picked.checkpoint.path},
              {"ok", report.ok()},
              {"chunks_verified", report.chunks_verified},
              {"bytes_verified", report.bytes_verified}};
  if (!picked.origin.is_null()) result["picked"] = picked.origin;
  if (!report.ok()) result["error"] = report.error;
  if (as_json) {
    fmt::print("{}\n", result.dump(2));
  } else if (report.ok()) {
    fmt::print("{}: ok, {} chunks ({}) verified\n", picked.checkpoint.path, report.chunks_verified,
               bytes_in_units(report.bytes_verified));
  } else {
    fmt::print("{}: FAILED after {} good chunks: {}\n", picked.checkpoint.path, report.chunks_verified, report.error);
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
  fmt::print("{} {} tensors ({}) and {} values in {:.2f} s ({:.2f} GB/s): {}\n", verb, tensors, bytes_in_units(bytes),
             values, seconds, seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0, fmt::join(files, ", "));
}

void export_checkpoint(const TransferOptions& options) {
  const Picked picked = pick_checkpoint(options.source);
  if (!options.json) say_picked(picked);
  const auto start = std::chrono::steady_clock::now();
  const dcp::SafetensorsExportResult result =
      dcp::export_safetensors(*picked.reader, options.out,
                              dcp::SafetensorsExportOptions()
                                  .prefix(options.prefix)
                                  .max_shard_bytes(*parse_byte_size(options.max_shard_size))
                                  .overwrite(options.overwrite));
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  print_transfer("exported", result.files, result.tensors, result.tensor_bytes, result.values, took.count(),
                 options.json, picked.origin);
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
