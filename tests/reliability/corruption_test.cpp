// Corruption: random, seeded damage to a checkpoint (flipped bytes in data and metadata
// files, truncation, deletion, files swapped between checkpoints) must make load fail
// with a stowage::Error naming an entry or a file and leave the target untouched, or,
// where the damage is harmless (a padding byte), load exactly the saved bytes. Never
// wrong data, never another kind of exception. STOWAGE_CORRUPTION_TRIALS and
// STOWAGE_CORRUPTION_SEED set the trial count and the seed.

#include "dcp/test_util.h"
#include "reliability/generations.h"
#include "reliability/report.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <random>

#include <unistd.h>

namespace stowage::reliability {
namespace {

using dcp::testing::ScratchDir;
namespace fs = std::filesystem;

enum class Fault { kFlipData, kFlipMetadata, kTruncate, kDelete, kSwapDataFile, kSwapMetadata, kCount };

const char* fault_name(Fault fault) {
  switch (fault) {
    case Fault::kFlipData:
      return "flip_data";
    case Fault::kFlipMetadata:
      return "flip_metadata";
    case Fault::kTruncate:
      return "truncate";
    case Fault::kDelete:
      return "delete";
    case Fault::kSwapDataFile:
      return "swap_data_file";
    case Fault::kSwapMetadata:
      return "swap_metadata";
    default:
      return "?";
  }
}

// Two checkpoints written with the same layout (so their files correspond) but of
// different generations.
struct Pair {
  ScratchDir a, b;
  std::vector<std::string> names;  // every name a must-mention check accepts
  explicit Pair(dcp::FileSystemWriterOptions options) {
    dcp::FileSystemWriter writer_a(a.path(), options), writer_b(b.path(), options);
    dcp::save(generation_state(1), writer_a);
    dcp::save(generation_state(2), writer_b);
    names = dcp::testing::list_files(a.path());
    const FlatStateDict flat = flatten_state_dict(generation_state(1));
    for (const FlatEntry& entry : flat.entries()) names.push_back(entry.fqn);
  }
};

std::string pick(const std::vector<std::string>& names, std::mt19937_64& random) {
  return names.at(std::uniform_int_distribution<size_t>(0, names.size() - 1)(random));
}

TEST(Corruption, DamagedCheckpointsFailNamingTheCulpritAndNeverLoadWrongData) {
  const int64_t trials = count_from_env("STOWAGE_CORRUPTION_TRIALS", 240);
  const uint64_t seed = static_cast<uint64_t>(count_from_env("STOWAGE_CORRUPTION_SEED", 8));
  std::mt19937_64 random(seed);
  Pair file_per_tensor(dcp::FileSystemWriterOptions().single_file_per_rank(false).sync_files(false));
  Pair file_per_thread(dcp::FileSystemWriterOptions().thread_count(2).sync_files(false));
  std::map<std::string, int64_t> injected, detected;
  int64_t bytes_flipped = 0, harmless = 0, truncated_bytes = 0;

  for (int64_t trial = 0; trial < trials; ++trial) {
    const Pair& pair = trial % 2 == 0 ? file_per_tensor : file_per_thread;
    const ScratchDir work;
    const std::string dir = work.sub("ckpt");
    fs::copy(pair.a.path(), dir);
    const std::vector<std::string> files = dcp::testing::list_files(dir);
    std::vector<std::string> data_files = dcp::testing::data_files(dir);
    const std::string metadata = dcp::kMetadataFileName;
    const Fault fault = static_cast<Fault>(trial % static_cast<int64_t>(Fault::kCount));
    std::string what;
    switch (fault) {
      case Fault::kFlipData:
      case Fault::kFlipMetadata: {
        const std::string name = fault == Fault::kFlipData ? pick(data_files, random) : metadata;
        std::string bytes = dcp::testing::read_file(dir + "/" + name);
        if (bytes.empty()) continue;  // an empty tensor's file: nothing to flip
        const int flips = std::uniform_int_distribution<int>(1, 8)(random);
        for (int i = 0; i < flips; ++i) {
          const size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(random);
          bytes[at] = static_cast<char>(bytes[at] ^ std::uniform_int_distribution<int>(1, 255)(random));
        }
        bytes_flipped += flips;
        dcp::testing::write_file(dir + "/" + name, bytes);
        what = fmt::format("{} bytes of {}", flips, name);
        break;
      }
      case Fault::kTruncate: {
        const std::string name = pick(files, random);
        const auto size = static_cast<int64_t>(fs::file_size(dir + "/" + name));
        if (size == 0) continue;
        const int64_t length = std::uniform_int_distribution<int64_t>(0, size - 1)(random);
        ASSERT_EQ(::truncate((dir + "/" + name).c_str(), length), 0);
        truncated_bytes += size - length;
        what = fmt::format("{} to {} of {} bytes", name, length, size);
        break;
      }
      case Fault::kDelete: {
        const std::string name = pick(files, random);
        fs::remove(dir + "/" + name);
        what = name;
        break;
      }
      case Fault::kSwapDataFile: {
        // The corresponding file of the other checkpoint, under this one's name.
        const std::vector<std::string> others = dcp::testing::data_files(pair.b.path());
        const size_t index = std::uniform_int_distribution<size_t>(0, data_files.size() - 1)(random);
        fs::copy_file(pair.b.path() + "/" + others.at(index), dir + "/" + data_files[index],
                      fs::copy_options::overwrite_existing);
        what = data_files[index];
        break;
      }
      case Fault::kSwapMetadata:
        fs::copy_file(pair.b.path() + "/" + metadata, dir + "/" + metadata, fs::copy_options::overwrite_existing);
        what = metadata;
        break;
      default:
        FAIL();
    }
    ++injected[fault_name(fault)];
    StateDict target = generation_state(-1);
    try {
      dcp::load(target, dir);
      // Harmless damage (gap bytes, a deleted file no entry uses): the exact saved bytes.
      const std::string difference = compare_to_generation(target, 1);
      ASSERT_EQ(difference, "") << "trial " << trial << ": " << fault_name(fault) << " " << what
                                << " loaded wrong data";
      ++harmless;
    } catch (const Error& e) {
      const std::string message = e.what();
      const bool names_culprit = std::any_of(pair.names.begin(), pair.names.end(), [&](const std::string& name) {
        return message.find(name) != std::string::npos;
      });
      EXPECT_TRUE(names_culprit) << "trial " << trial << ": " << what
                                 << ": the error names no entry or file: " << message;
      // Damage is a CorruptionError naming its entry or file; a deleted metadata file, an
      // IoError (there is no checkpoint to be corrupt); a flipped version number, the
      // plain Error of a format this build does not read.
      const auto* corruption = dynamic_cast<const CorruptionError*>(&e);
      const auto* io = dynamic_cast<const IoError*>(&e);
      const bool other_version = message.find("format version") != std::string::npos;
      EXPECT_TRUE(corruption != nullptr || (io != nullptr && io->error_number() == ENOENT) || other_version)
          << "trial " << trial << ": " << what << ": neither a CorruptionError nor a missing file: " << message;
      if (corruption != nullptr) {
        EXPECT_FALSE(corruption->entry().empty() && corruption->file().empty()) << "trial " << trial << ": " << message;
      }
      EXPECT_EQ(compare_to_generation(target, -1), "") << "trial " << trial << ": a failed load changed the target";
      ++detected[fault_name(fault)];
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << ": " << fault_name(fault) << " " << what
                    << ": not a stowage::Error: " << e.what();
    }
  }
  int64_t total = 0;
  for (const auto& [name, count] : injected) {
    record_figure("corruption." + name + ".injected", count);
    record_figure("corruption." + name + ".detected", detected[name]);
    total += count;
  }
  record_figure("corruption.seed", static_cast<int64_t>(seed));
  record_figure("corruption.trials", total);
  record_figure("corruption.bytes_flipped", bytes_flipped);
  record_figure("corruption.bytes_truncated", truncated_bytes);
  record_figure("corruption.harmless_loaded_exact", harmless);
  EXPECT_GT(total, 0);
}

}  // namespace
}  // namespace stowage::reliability
