// The sweep of every injection point: each file-system call of a save and of a load is
// failed in turn, one per run, through FaultInjectionEnv. Every run must end in an
// IoError naming the failed call's operation and path, lose nothing (the directory
// loads, bit for bit, as the checkpoint it held before or, for a failure after the
// commit, as the new one), leak nothing (the next save leaves exactly the files its
// metadata lists) and, for a load, change nothing of the state it loads into.
//
// The only calls whose failure may go unreported are those of cleaning up after a
// commit or after an earlier crash: listing the directory, removing files, and reading
// the committed metadata to know which files are orphans. Their failure leaves files
// that the next save removes, which the sweep checks.

#include "dcp/fault_injection_env.h"
#include "dcp/test_util.h"

#include <stowage/dcp/checkpoint.h>
#include <stowage/dcp/filesystem.h>
#include <stowage/error.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

namespace stowage::dcp {
namespace {

using testing::Call;
using testing::FaultInjectionEnv;
using testing::ScratchDir;

// Distinct values for each `seed`, of several dtypes and sizes, and a non-tensor entry.
StateDict sweep_state(int64_t seed) {
  StateDict state;
  state.insert("weight", torch::arange(seed, seed + 600, torch::kFloat).reshape({20, 30}));
  state.insert("bias", torch::full({7}, static_cast<double>(seed), torch::kDouble));
  state.insert("ids", torch::arange(seed * 100, seed * 100 + 1000, torch::kLong));
  state.insert("step", c10::IValue(seed));
  return state;
}

bool bitwise_equal_states(const StateDict& a, const StateDict& b) {
  for (const auto& item : a) {
    const c10::IValue& x = item.value();
    const c10::IValue& y = b.at(item.key());
    if (x.isTensor() != y.isTensor()) return false;
    if (!x.isTensor()) {
      if (!x.isInt() || !y.isInt() || x.toInt() != y.toInt()) return false;
      continue;
    }
    const at::Tensor s = x.toTensor().contiguous();
    const at::Tensor t = y.toTensor().contiguous();
    if (s.scalar_type() != t.scalar_type() || s.sizes() != t.sizes() ||
        std::memcmp(s.data_ptr(), t.data_ptr(), s.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

// What the directory loads as (through the real file system).
StateDict load_directory(const std::string& path) {
  StateDict state = sweep_state(-1);
  load(state, path);
  return state;
}

// A data file of stowage's naming that no checkpoint lists, as a crashed save leaves it.
const char* const kOrphan = "data-00000000deadbeef-r0-0.data";

// The directory of a run: checkpoint 1 committed, and an orphan beside it.
void prepare_directory(const ScratchDir& dir) {
  save(sweep_state(1), dir.path());
  testing::write_file(dir.sub(kOrphan), "left by a crash");
}

// The calls a save of checkpoint 2 over prepare_directory() makes, by kind.
std::map<Call, int64_t> count_save_calls(FaultInjectionEnv& env) {
  const ScratchDir dir;
  prepare_directory(dir);
  env.fail(Call::kOpen, 0);
  FileSystemWriter writer(dir.path(), FileSystemWriterOptions().env(&env));
  save(sweep_state(2), writer);
  std::map<Call, int64_t> counts;
  for (Call call : testing::kAllCalls) counts[call] = env.count(call);
  return counts;
}

// A save that fails must say which call failed, on which path.
void expect_names_the_fault(const IoError& error, Call call, const std::string& path, const std::string& run) {
  EXPECT_EQ(error.operation(), testing::operation_of(call)) << run << ": " << error.what();
  EXPECT_EQ(error.path(), path) << run << ": " << error.what();
  EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << run << ": " << error.what();
}

// After the next save the directory holds its metadata and the files it lists, only.
void expect_nothing_leaks(const std::string& path, const std::string& run) {
  const Metadata metadata = save(sweep_state(3), path);
  std::vector<std::string> expected = metadata.files();
  expected.push_back(kMetadataFileName);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(testing::list_files(path), expected) << run;
}

bool is_cleanup(Call call, const std::string& path) {
  const bool committed_metadata = path.size() >= std::strlen(kMetadataFileName) &&
                                  path.compare(path.size() - std::strlen(kMetadataFileName),
                                               std::strlen(kMetadataFileName), kMetadataFileName) == 0;
  return call == Call::kUnlink || call == Call::kList ||
         (committed_metadata && (call == Call::kOpen || call == Call::kRead || call == Call::kStat));
}

TEST(DcpFaultInjection, EveryFailedCallOfASaveIsReportedAndLosesNothing) {
  FaultInjectionEnv env;
  const std::map<Call, int64_t> counts = count_save_calls(env);
  // The save makes every kind of call but reading a mapping.
  for (Call call : {Call::kOpen, Call::kWrite, Call::kFsync, Call::kRename, Call::kUnlink, Call::kRead, Call::kList,
                    Call::kMkdir, Call::kLock, Call::kStat}) {
    EXPECT_GT(counts.at(call), 0) << testing::operation_of(call);
  }
  const StateDict before = sweep_state(1);
  const StateDict after = sweep_state(2);
  int64_t runs = 0;
  for (const auto& [call, count] : counts) {
    for (int64_t k = 1; k <= count; ++k) {
      const std::string run = fmt::format("{} #{} of {}", testing::operation_of(call), k, count);
      const ScratchDir dir;
      prepare_directory(dir);
      env.fail(call, k);
      bool reported = false;
      try {
        FileSystemWriter writer(dir.path(), FileSystemWriterOptions().env(&env));
        save(after, writer);
      } catch (const IoError& error) {
        reported = true;
        ASSERT_TRUE(env.failed_path()) << run << ": " << error.what();
        expect_names_the_fault(error, call, *env.failed_path(), run);
      }
      ASSERT_TRUE(env.failed_path()) << run << ": the call was not made";
      const StateDict loaded = load_directory(dir.path());
      if (reported) {
        EXPECT_TRUE(bitwise_equal_states(loaded, before) || bitwise_equal_states(loaded, after)) << run;
      } else {
        EXPECT_TRUE(is_cleanup(call, *env.failed_path())) << run << " on " << *env.failed_path() << " went unreported";
        EXPECT_TRUE(bitwise_equal_states(loaded, after)) << run;
      }
      expect_nothing_leaks(dir.path(), run);
      ++runs;
    }
  }
  EXPECT_GE(runs, 20);
}

TEST(DcpFaultInjection, EveryFailedCallOfALoadIsReportedAndChangesNothing) {
  const ScratchDir dir;
  save(sweep_state(1), dir.path());
  FaultInjectionEnv env;
  env.fail(Call::kOpen, 0);
  {
    FileSystemReader reader(dir.path(), &env);
    StateDict state = sweep_state(5);
    load(state, reader);
    ASSERT_TRUE(bitwise_equal_states(state, sweep_state(1)));
  }
  std::map<Call, int64_t> counts;
  for (Call call : testing::kAllCalls) counts[call] = env.count(call);
  for (Call call : {Call::kOpen, Call::kRead, Call::kMmap, Call::kStat}) {
    EXPECT_GT(counts.at(call), 0) << testing::operation_of(call);
  }
  for (const auto& [call, count] : counts) {
    for (int64_t k = 1; k <= count; ++k) {
      const std::string run = fmt::format("{} #{} of {}", testing::operation_of(call), k, count);
      env.fail(call, k);
      StateDict state = sweep_state(5);
      try {
        FileSystemReader reader(dir.path(), &env);
        load(state, reader);
        ADD_FAILURE() << run << ": the load succeeded";
      } catch (const IoError& error) {
        ASSERT_TRUE(env.failed_path()) << run << ": " << error.what();
        expect_names_the_fault(error, call, *env.failed_path(), run);
      }
      EXPECT_TRUE(bitwise_equal_states(state, sweep_state(5))) << run << ": the failed load changed the state";
    }
  }
  EXPECT_TRUE(bitwise_equal_states(load_directory(dir.path()), sweep_state(1)));
}

}  // namespace
}  // namespace stowage::dcp
