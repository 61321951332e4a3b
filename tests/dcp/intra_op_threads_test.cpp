// stowage's threads run ATen serially (src/util/intra_op_threads.h), and stowage's own split
// over ATen's threads reaches them. An op that splits its work on a second thread starts an
// OpenMP team of that thread's own, and libgomp then throttles the training thread's team
// for as long as that thread lives (issue 37). The first two tests count the process's
// threads: a team of its own would add a worker. At most, not
// exactly: a thread an earlier test left (a pool worker of a thread that ended) may still
// be on its way out when the test counts (sanitize.sh runs every dcp test in one process).
#include "dcp/test_util.h"
#include "util/intra_op_threads.h"

#include <stowage/dcp/staging.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace stowage::dcp {
namespace {

using testing::state_of;

std::ptrdiff_t process_threads() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator());
}

// Large enough for ATen to split a fill or a copy over its threads.
at::Tensor large_tensor() {
  return at::empty({int64_t(1) << 22}).fill_(1.5);
}

// Two intra-op threads for the test (a machine's default may be one), as `stowage train`
// gives the training thread by default.
class TwoIntraOpThreads {
 public:
  TwoIntraOpThreads() : previous_(at::get_num_threads()) { at::set_num_threads(2); }
  ~TwoIntraOpThreads() { at::set_num_threads(previous_); }
  TwoIntraOpThreads(const TwoIntraOpThreads&) = delete;
  TwoIntraOpThreads& operator=(const TwoIntraOpThreads&) = delete;

 private:
  int previous_;
};

// ATen starts OpenMP teams only under its OpenMP backend.
bool aten_starts_openmp_teams() {
  return at::get_parallel_info().find("OpenMP") != std::string::npos;
}

TEST(IntraOpThreads, AThreadMadeSerialRunsItsOpsOnItselfAlone) {
  if (!aten_starts_openmp_teams()) GTEST_SKIP() << "ATen here starts no OpenMP team: " << at::get_parallel_info();
  const TwoIntraOpThreads threads;
  const int training_threads = at::get_num_threads();
  large_tensor().mul_(2);  // the training thread's team exists before the count
  const std::ptrdiff_t before = process_threads();
  int threads_seen = 0;
  std::ptrdiff_t during = 0;
  std::thread background([&] {
    util::run_aten_serially_on_this_thread();
    threads_seen = at::get_num_threads();
    large_tensor().mul_(2);
    during = process_threads();
  });
  background.join();
  EXPECT_EQ(threads_seen, 1);
  EXPECT_LE(during, before + 1) << "the background thread started workers of its own";
  EXPECT_EQ(at::get_num_threads(), training_threads) << "the training thread's team changed";
}

TEST(IntraOpThreads, StagingACpuTensorStartsNoTeamOnTheStagingThread) {
  if (!aten_starts_openmp_teams()) GTEST_SKIP() << "ATen here starts no OpenMP team: " << at::get_parallel_info();
  const TwoIntraOpThreads threads;
  large_tensor().mul_(2);
  const StateDict state = state_of({{"weights", large_tensor()}});
  const std::ptrdiff_t before = process_threads();
  DefaultStager stager(StagingOptions().use_pinned_memory(false).use_shared_memory(false));
  auto staged = stager.stage_in_background(SaveableState(state));
  ASSERT_TRUE(staged.has_value());
  EXPECT_TRUE(at::equal(staged->get().state_dict().at("weights").toTensor(), state.at("weights").toTensor()));
  // The staging thread lives as long as the stager: it alone is new.
  EXPECT_LE(process_threads(), before + 1) << "the staging thread started workers of its own";
}

// stowage compiles without -fopenmp, where at::parallel_for runs serially: this split
// must reach ATen's threads, and cover every element once.
TEST(IntraOpThreads, ParallelOverElementsSplitsOverAtensThreads) {
  if (!aten_starts_openmp_teams()) GTEST_SKIP() << "ATen here starts no OpenMP team: " << at::get_parallel_info();
  const TwoIntraOpThreads threads;
  const at::Tensor tensor = large_tensor();
  std::mutex mutex;
  std::set<std::thread::id> ran_on;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  util::parallel_over_elements(tensor, 1 << 16, [&](int64_t begin, int64_t end) {
    const std::lock_guard<std::mutex> lock(mutex);
    ran_on.insert(std::this_thread::get_id());
    ranges.emplace_back(begin, end);
  });
  EXPECT_EQ(ran_on.size(), 2U);
  std::sort(ranges.begin(), ranges.end());
  int64_t next = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, next);
    EXPECT_GT(end, begin);
    next = end;
  }
  EXPECT_EQ(next, tensor.numel());
}

}  // namespace
}  // namespace stowage::dcp
